"""Runtime integrity guards on CPU: the dispatch-mode op recorder, the trusted-function snapshot,
the thread census and the model-class checks run here for real on CPU tensors; the L2 and kernel
census parts run on a GPU (marked `gpu`) and on recorded GPU output."""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import kb_mcp.harness.worker.rounding as rounding
import kb_mcp.harness.worker.values as values
from kb_mcp.harness.judgment.verdict import Finding, FindingCode
from kb_mcp.harness.worker.integrity import RETIRE_WORKER, IntegrityGuard, dedupe
from kb_mcp.harness.worker.integrity_runtime import (
    KernelCensus,
    KernelLaunch,
    OpRecorder,
    ProfilerEvent,
    TrustedSnapshot,
    census,
    census_findings,
    classify_launches,
    l2_findings,
    l2_state,
    launches_from_events,
    reset_l2_persistence,
)
from kb_mcp.harness.worker.loading import load_module

C = FindingCode
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="module")
def pristine() -> TrustedSnapshot:
    return TrustedSnapshot.capture()


@pytest.fixture
def guard(pristine: TrustedSnapshot) -> Iterator[IntegrityGuard]:
    g = IntegrityGuard(trusted=pristine)
    yield g
    pristine.restore()  # a failing test must not leave patches behind for the next one


def _load(tmp_path: Path, source: str, name: str) -> object:
    return load_module(source, name, tmp_path)


CANDIDATE = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        out = torch.empty_like(x)
        flat = x.contiguous().view(-1)
        same = x.to(x.dtype)
        return torch.softmax(x, dim=-1)
'''


def test_recorder_reports_compute_ops_with_candidate_line(guard: IntegrityGuard, tmp_path: Path) -> None:
    module = _load(tmp_path, CANDIDATE, "cand_softmax")
    assert guard.attach(module) == []
    model = module.ModelNew()
    x = torch.randn(4, 8)
    with guard.watch():
        model(x)
    found = guard.findings()
    assert [f.code for f in found] == [C.library_call]
    assert "softmax" in found[0].message and "cand_softmax.py:14" in found[0].message
    assert found[0].line == 14
    names = [e.name for e in guard.recorder.events]
    assert "aten::empty_like" in names and all(e.allowed for e in guard.recorder.events if "softmax" not in e.name)


def test_recorder_under_inference_mode_and_allow_list(tmp_path: Path) -> None:
    x = torch.randn(8, 8)
    rec = OpRecorder()
    with torch.inference_mode(), rec:
        torch.nn.functional.linear(x, x)
        x.reshape(64)
        x.to(torch.float64)
    assert {e.packet for e in rec.banned()} == {"linear", "to"}
    allowed = OpRecorder(allow={"linear", "mm", "addmm"})
    with allowed:
        torch.nn.functional.linear(x, x)
    assert allowed.banned() == []


def test_recorder_allows_registered_custom_ops() -> None:
    lib = torch.library.Library("kbmcp_test", "FRAGMENT")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CPU")
    x = torch.ones(3)
    rec = OpRecorder()
    with rec:
        torch.ops.kbmcp_test.twice(x)
    assert [e.name for e in rec.events] == ["kbmcp_test::twice"]
    assert rec.banned() == []


def test_snapshot_catches_replaced_functions_and_settings(pristine: TrustedSnapshot) -> None:
    assert pristine.verify() == []
    original = torch.cuda.Event.elapsed_time
    try:
        torch.cuda.Event.elapsed_time = lambda self, end: 0.001  # type: ignore[method-assign]
        time.perf_counter = lambda: 0.0  # type: ignore[assignment]
        torch.backends.cuda.matmul.allow_tf32 = True
        found = pristine.verify()
        messages = " ".join(f.message for f in found)
        assert {f.code for f in found} == {C.harness_tampering, C.tf32_switch}
        assert "torch.cuda.Event.elapsed_time" in messages and "time.perf_counter" in messages
        assert "test_integrity_runtime.py" in messages  # says where the replacement came from
        assert pristine.trusted.event_elapsed_time is original  # the core keeps the real one
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
        pristine.restore()
    assert pristine.verify() == []
    assert torch.cuda.Event.elapsed_time is original


@pytest.mark.parametrize("switch", ["flash_sdp", "math_sdp", "anomaly"])
def test_switching_the_references_kernels_or_autograd_modes_is_seen(pristine: TrustedSnapshot, switch: str) -> None:
    """The reference's attention kernels switched off, or anomaly detection on, slow it where it is
    timed beside the candidate: the settings are watched like the numerics."""
    flip = {"flash_sdp": (torch.backends.cuda.enable_flash_sdp, torch.backends.cuda.flash_sdp_enabled),
            "math_sdp": (torch.backends.cuda.enable_math_sdp, torch.backends.cuda.math_sdp_enabled),
            "anomaly": (torch.autograd.set_detect_anomaly, torch.is_anomaly_enabled)}[switch]
    setter, getter = flip
    before = getter()
    try:
        setter(not before)
        found = pristine.verify()
        assert [f.code for f in found] == [C.harness_tampering], found
        assert "changed from" in found[0].message and "Leave global settings alone" in found[0].message
    finally:
        setter(before)
    assert pristine.verify() == []


def test_torch_compiles_own_settings_are_watched(pristine: TrustedSnapshot) -> None:
    import torch._dynamo.config as dynamo_config

    patch = dynamo_config.patch(disable=True)
    patch.__enter__()  # a form the static rules do not read, as a candidate could write it
    try:
        found = pristine.verify()
        assert [f.code for f in found] == [C.harness_tampering], found
        assert "torch._dynamo.config (its hash)" in found[0].message
    finally:
        patch.__exit__(None, None, None)
    assert pristine.verify() == []


COMPILE_THEN_SETTINGS = """
import torch
from kb_mcp.harness.worker.main import compile_baseline_in_process
from kb_mcp.harness.worker.trusted import TrustedSnapshot, compiler_settings
compile_baseline_in_process()
snap, before = TrustedSnapshot.capture(), compiler_settings()
compiled = torch.compile(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)))
compiled(torch.randn(2, 16)); compiled(torch.randn(2, 16))
print(repr((snap.setting_changes(), compiler_settings() == before)))
"""


@pytest.mark.slow
def test_compiling_changes_none_of_the_watched_settings() -> None:
    """A worker that timed a torch.compile baseline goes on serving candidates against the same settings."""
    import ast
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", COMPILE_THEN_SETTINGS], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    changes, same = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert changes == [] and same


def test_the_profiler_the_census_reads_is_watched(pristine: TrustedSnapshot) -> None:
    # A candidate that rescales the profiler's event durations would fake its device time.
    from kb_mcp.harness.worker.profiling import measure_device_time

    event = torch._C._autograd._KinetoEvent
    original = event.duration_ns
    try:
        event.duration_ns = lambda self: 1  # type: ignore[method-assign]
        messages = " ".join(f.message for f in pristine.verify() if f.code == C.harness_tampering)
        assert "torch._C._autograd._KinetoEvent.duration_ns" in messages
    finally:
        pristine.restore()
    assert event.duration_ns is original and pristine.verify() == []
    # and the census's own sessions leave it as it was
    measure_device_time(lambda: torch.randn(64).exp(), lambda: None, runs=2)
    assert pristine.verify() == []


def test_the_harness_tables_are_watched(pristine: TrustedSnapshot) -> None:
    # A candidate that loosened a tolerance or a limit would loosen its own checks.
    float32 = values.DEFAULT_TOLERANCES["float32"]
    bound = rounding.PROBE_BOUND  # the float64 judgment's bound, as the rounding module holds it
    try:
        values.DEFAULT_TOLERANCES["float32"] = (1.0, 1.0)  # edited in place: the same dict
        rounding.PROBE_BOUND = 1e9  # rebound
        found = {f.message.split("`")[1] for f in pristine.verify() if f.code == C.harness_tampering}
        assert found == {"kb_mcp.harness.worker.values.DEFAULT_TOLERANCES",
                         "kb_mcp.harness.worker.rounding.PROBE_BOUND"}
    finally:
        values.DEFAULT_TOLERANCES["float32"] = float32
        pristine.restore()
    assert bound == rounding.PROBE_BOUND and pristine.verify() == []


def test_snapshot_quiet_after_ordinary_torch_work(pristine: TrustedSnapshot) -> None:
    # Lazy imports and first uses inside PyTorch must not look like tampering.
    with OpRecorder():
        torch.randn(16, 16).softmax(-1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        torch.randn(4) + 1
    importlib.import_module("torch.utils.cpp_extension")

    assert pristine.verify() == []


def test_harness_modules_are_watched(pristine: TrustedSnapshot) -> None:
    import kb_mcp.harness.judgment.integrity_static as static

    original = static.check_source
    try:
        static.check_source = lambda *a, **k: []  # type: ignore[assignment]
        assert any("kb_mcp.harness.judgment.integrity_static.check_source" in f.message for f in pristine.verify())
    finally:
        static.check_source = original


THREADED = '''
import threading
import time
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, linger):
        super().__init__()
        self.linger = linger

    def forward(self, x):
        t = threading.Thread(target=time.sleep, args=(self.linger,), name="late-work")
        t.start()
        if self.linger == 0:
            t.join()
        return x
'''


def test_thread_left_running_after_forward(guard: IntegrityGuard, tmp_path: Path) -> None:
    module = _load(tmp_path, THREADED, "cand_threads")
    with guard.watch():
        module.ModelNew(0)(torch.ones(1))
    assert guard.findings() == []
    with guard.watch():
        module.ModelNew(0.5)(torch.ones(1))
    found = guard.findings()
    assert [f.code for f in found] == [C.background_thread]
    assert "late-work" in found[0].message
    assert IntegrityGuard.retire_worker(found)


def test_thread_started_at_import(guard: IntegrityGuard, tmp_path: Path) -> None:
    source = "import threading, time\n_t = threading.Thread(target=time.sleep, args=(0.5,), daemon=True)\n_t.start()\n"
    with guard.watch_setup():
        _load(tmp_path, source, "cand_import_thread")
    assert [f.code for f in guard.findings()] == [C.background_thread]


def test_model_class_checks(guard: IntegrityGuard, tmp_path: Path) -> None:
    source = '''
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x

class ModelNew(Model):
    pass

class Wrapper(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Model()
'''
    module = _load(tmp_path, source, "cand_subclass")
    found = guard.attach(module, module.Wrapper(), reference=module.Model)
    assert [f.code for f in found] == [C.reference_fallback, C.reference_fallback]
    assert "subclasses" in found[0].message and "`inner`" in found[1].message


def test_guard_removal_is_reported(guard: IntegrityGuard) -> None:
    from torch.utils._python_dispatch import _pop_mode

    x = torch.ones(4)
    # the recorder cannot exit a stack it is no longer on
    with pytest.raises(RuntimeError, match="empty mode stack"):
        with guard.watch():
            _pop_mode()  # what a candidate would do to run ops unseen
            torch.exp(x)
    found = guard.findings()
    assert [f.code for f in found] == [C.harness_tampering]
    assert "op recorder" in found[0].message


# ---------------------------------------------------------------------------------------------
# Kernel census: classification logic on recorded launches, and the CPU path


def test_classify_launches_sorts_own_library_and_torch() -> None:
    launches = [
        KernelLaunch(name="chain", op=None),
        KernelLaunch(name="void at::native::vectorized_elementwise_kernel<4, ...>", op="aten::fill_"),
        KernelLaunch(name="void at::native::(anonymous namespace)::softmax_warp_forward<...>", op="aten::_softmax"),
        KernelLaunch(name="sm90_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x32", op=None),
        KernelLaunch(name="Memset (Device)", op=None, kind="memset"),
    ]
    c = classify_launches(launches)
    assert c.own == ["chain"]
    assert c.library == ["sm90_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x32"]
    assert c.torch_ops == ["aten::_softmax"]  # fill_ belongs to an allowed op (zeros)
    assert {f.code for f in census_findings(c)} == {C.library_call}
    assert classify_launches(launches, allow={"cublas", "_softmax"}).library == []
    none_own = classify_launches([KernelLaunch(name="void at::native::reduce_kernel<...>", op="aten::sum")])
    assert C.no_custom_kernel in {f.code for f in census_findings(none_own)}
    assert census_findings(KernelCensus(available=False)) == []


def test_user_kernel_names_that_look_like_gemm_stay_own() -> None:
    c = classify_launches([KernelLaunch(name="gemm_kernel"), KernelLaunch(name="matmul_tiled"),
                           KernelLaunch(name="sgemm_v2")])
    assert c.own == ["gemm_kernel", "matmul_tiled", "sgemm_v2"]


def test_torch_kernels_that_lost_their_op_are_neither_own_nor_banned() -> None:
    c = classify_launches([KernelLaunch(name="void at::native::vectorized_elementwise_kernel<4, FillFunctor<float>>")])
    assert c.own == [] and c.torch_ops == [] and c.unattributed
    assert [f.code for f in census_findings(c)] == [C.no_custom_kernel]


def test_launches_from_profiler_events() -> None:
    """Device events link to the innermost named op; the profiler's own records are not ops."""
    events = [
        ProfilerEvent(name="aten::zeros", device="cpu", correlation_id=7, linked_correlation_id=0, activity="cpu_op"),
        ProfilerEvent(name="Activity Buffer Request", device="cpu", correlation_id=7, linked_correlation_id=0),
        ProfilerEvent(name="kbmcp::candidate_forward", device="cpu", correlation_id=3, linked_correlation_id=0,
                      activity="user_annotation"),
        ProfilerEvent(name="void at::native::fill_kernel", device="cuda", correlation_id=100, linked_correlation_id=7,
                      activity="kernel"),
        ProfilerEvent(name="chain", device="cuda", correlation_id=101, linked_correlation_id=3, activity=""),
        ProfilerEvent(name="kbmcp::candidate_forward", device="cuda", correlation_id=3, linked_correlation_id=3,
                      activity=""),
        ProfilerEvent(name="range", device="cuda", correlation_id=5, linked_correlation_id=3,
                      activity="gpu_user_annotation"),
        ProfilerEvent(name="Memcpy HtoD (Pageable -> Device)", device="cuda", correlation_id=102,
                      linked_correlation_id=3),
    ]
    launches = launches_from_events(events)
    assert [(x.name, x.op, x.kind) for x in launches] == [
        ("void at::native::fill_kernel", "aten::zeros", "kernel"),
        ("chain", None, "kernel"),
        ("Memcpy HtoD (Pageable -> Device)", None, "memcpy"),
    ]


RECORDED = sorted(DATA.glob("census_*.json"))


@pytest.mark.skipif(not RECORDED, reason="no recorded GPU census in tests/harness/data")
@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_recorded_gpu_census(path: Path) -> None:
    """Censuses recorded on a GPU (tests/harness/record_census.py) classify as the recording says."""
    data = json.loads(path.read_text())
    for case in data["cases"]:
        events = [ProfilerEvent.model_validate(x) for x in case["events"]]
        got = classify_launches(launches_from_events(events), case.get("allow", []))
        assert bool(got.own) == case["expect_own"], (case["name"], got)
        assert bool(got.library or got.torch_ops) == case["expect_library"], (case["name"], got)


def test_census_without_gpu_is_unavailable() -> None:
    if torch.cuda.is_available():
        pytest.skip("CPU behaviour")
    result = census(lambda: torch.ones(3) * 2)
    assert result.available is False and "no CUDA" in result.note
    assert census_findings(result) == []
    assert l2_state().error == "no CUDA device"


def test_dedupe_and_retire_set() -> None:
    f = Finding(code=C.library_call, message="m")
    assert dedupe([f, f, Finding(code=C.library_call, message="n")]) == [f, Finding(code=C.library_call, message="n")]
    assert C.harness_tampering in RETIRE_WORKER and C.library_call not in RETIRE_WORKER


# ---------------------------------------------------------------------------------------------
# GPU: L2 persistence through the driver, census of real launches


@pytest.mark.gpu
def test_l2_persistence_seen_and_reset() -> None:
    import ctypes

    torch.zeros(1, device="cuda")
    reset_l2_persistence()
    assert not l2_state().persistent
    lib = ctypes.CDLL("libcuda.so.1")
    assert lib.cuCtxSetLimit(ctypes.c_int(6), ctypes.c_size_t(4 << 20)) == 0
    state = l2_state()
    assert state.persistent and state.persisting_limit_bytes and state.persisting_limit_bytes > 0
    assert [f.code for f in l2_findings(state)] == [C.l2_persistence]
    reset_l2_persistence()
    assert not l2_state().persistent


@pytest.mark.gpu
def test_census_of_real_launches() -> None:
    x = torch.randn(1024, device="cuda")
    kernel = torch.cuda._compile_kernel(
        'extern "C" __global__ void twice(const float* x, float* y, int n) '
        "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = 2.0f * x[i]; }",
        "twice",
    )

    def own() -> torch.Tensor:
        y = torch.empty_like(x)
        kernel(grid=(4, 1, 1), block=(256, 1, 1), args=[x, y, x.numel()])
        return y

    mine = census(own)
    assert mine.available and mine.own == ["twice"] and not mine.torch_ops and not mine.library
    theirs = census(lambda: torch.softmax(x, 0) + torch.mm(x.view(32, 32), x.view(32, 32)).sum())
    assert theirs.available and theirs.own == [] and theirs.torch_ops
    assert C.no_custom_kernel in {f.code for f in census_findings(theirs)}


@pytest.mark.gpu
def test_snapshot_quiet_after_ordinary_gpu_work() -> None:
    """cuBLAS, cuDNN, the attention kernels and cuSOLVER initialise lazily on first use: none of
    that may read as a changed setting (the next honest candidate would be `invalid`)."""
    snap = TrustedSnapshot.capture()
    x = torch.randn(256, 256, device="cuda")
    (x @ x).sum().item()
    torch.nn.functional.conv2d(x.view(1, 1, 256, 256), torch.randn(4, 1, 3, 3, device="cuda")).sum().item()
    q = torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.float16)
    torch.nn.functional.scaled_dot_product_attention(q, q, q).sum().item()
    torch.linalg.inv(x + 256 * torch.eye(256, device="cuda")).sum().item()
    assert snap.verify() == []
