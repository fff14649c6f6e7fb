"""The checks on the device and on the host (`MemoryPlan.pristine`, `VerifyOptions.checks_on`), on a
GPU: the same candidates get the same judgment on either path (verdict, findings, which sets pass),
the pristine copies behave alike on CUDA tensors, and one large problem's phases on both paths are
logged side by side (`KBMCP_CHECKS_LOG`: a JSON line per path)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness_helpers import fixture_source

from kb_mcp.harness.gpu.memory import GIB, bound
from kb_mcp.harness.judgment.verdict import VerifyOptions, VerifyResult
from kb_mcp.harness.pool.pool import WorkerPool
from kb_mcp.harness.problem import load_problem, parse_problem

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "adversarial"))
from adversarial_cases import CASES, Case

pytestmark = pytest.mark.gpu

QUICK = VerifyOptions(timing=False, compile_baseline=False)
# Cheats whose failure does not depend on luck (the secret seeds differ between the two runs), each
# caught by a different check, and honest candidates beside them.
CHOSEN = ("input_mutation", "distribution_shortcut", "constant_output", "seed_prediction", "pointer_cache",
          "lowered_precision", "abs_dropped", "layer_norm_nvrtc", "row_max_nvrtc", "abs_affine_nvrtc")
PAIRS = [c for c in CASES if c.id in CHOSEN]

RELU = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn({rows}, 1 << 14)]


def get_init_inputs():
    return []
"""
LARGE = parse_problem(RELU.format(rows=1 << 16), name="relu_4gib")  # 4 GiB in, 4 GiB out


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerPool]:
    with WorkerPool(tmp_path_factory.mktemp("checks-cache"), prestart=True) as p:
        yield p


def judgment(result: VerifyResult, honest: bool = True) -> tuple[str, set[str], list[tuple[str, bool, bool]]]:
    """What must agree between the paths: the verdict, the finding codes, and for an honest candidate
    each set's kind and outcome. A cheat's sets may differ: one caching on pointers hits or misses as
    the allocator places the sets, and the device path holds one more set on the GPU."""
    return (result.verdict.value, {f.code.value for f in result.findings},
            [(s.kind, s.passed, s.skipped) for s in result.input_sets] if honest else [])


def both_paths(pool: WorkerPool, problem: Any, source: str, options: VerifyOptions) -> dict[str, VerifyResult]:
    """One verification with the checks on the device, one with them on the host."""
    out: dict[str, VerifyResult] = {}
    for where in ("device", "host"):
        result = pool.verify(problem, source, options.model_copy(update={"checks_on": where}))
        assert result.memory is not None and result.memory.plan.pristine == where, result.summary
        out[where] = result
    return out


@pytest.mark.parametrize("case", PAIRS, ids=lambda c: c.id)
def test_the_device_path_judges_as_the_host_path(pool: WorkerPool, case: Case) -> None:
    options = QUICK.model_copy(update={"allow": list(case.allow)})
    got = both_paths(pool, load_problem(case.problem_path), case.path.read_text(), options)
    device, host = judgment(got["device"], case.honest), judgment(got["host"], case.honest)
    assert device == host, (got["device"].summary, got["host"].summary)
    assert device[0] in case.verdicts, got["device"].summary
    assert case.honest or device[1] & set(case.codes_any), device


def test_the_float64_judgment_is_the_same_on_both_paths(pool: WorkerPool) -> None:
    problem = load_problem(Path(__file__).parent / "fixtures" / "seqsum_problem.py")
    got = both_paths(pool, problem, fixture_source("seqsum_nvrtc_double.py"), QUICK)
    assert judgment(got["device"]) == judgment(got["host"])
    for result in got.values():
        judged = [s for s in result.input_sets if s.float64_ratio is not None]
        assert judged and all(s.passed and (s.float64_ratio or 0.0) < 1.0 for s in judged), result.input_sets


def test_pristine_copies_agree_on_cuda_tensors() -> None:
    import torch

    from kb_mcp.harness.worker.pristine import Pristine

    g = torch.Generator(device="cuda").manual_seed(7)
    xs = [torch.randn(1 << 22, device="cuda", generator=g), torch.arange(1000, device="cuda")]
    device, host = Pristine("device"), Pristine("host")
    kept_d, kept_h = device.keep(xs), host.keep(xs)
    assert kept_h[0].device.type == "cpu" and kept_h[0].is_pinned()
    args = [x.clone() for x in xs]
    assert device.changed(args, kept_d) == host.changed(args, kept_h) == []
    args[0][12345] = float("nan")
    args[1][999] = -1
    assert device.changed(args, kept_d) == host.changed(args, kept_h) == [0, 1]
    host.restore(args, kept_h, [0, 1])
    assert device.changed(args, kept_d) == []


def test_one_large_problem_on_both_paths_within_the_bound(pool: WorkerPool) -> None:
    """The phases of a 4 GiB-in, 4 GiB-out problem's verdict on both paths, side by side; each
    path's device peak within its bound."""
    got = both_paths(pool, LARGE, fixture_source("relu_nvrtc.py"), VerifyOptions(compile_baseline=False))
    assert judgment(got["device"]) == judgment(got["host"]), got["device"].summary
    lines = []
    for where, result in got.items():
        memory = result.memory
        assert memory is not None
        assert memory.footprint.input_bytes == 4 << 30 and memory.footprint.output_bytes == 4 << 30
        taken = (None if memory.device_peak_bytes is None or memory.device_idle_bytes is None
                 else memory.device_peak_bytes - memory.device_idle_bytes)
        limit = bound(memory.footprint, memory.plan.pristine)
        lines.append({"checks_on": where, "verdict": result.verdict.value, "elapsed_s": result.elapsed_s,
                      "phases_s": result.phases_s, "device_above_idle_gib": None if taken is None else taken / GIB,
                      "bound_gib": limit / GIB, "verify_peak_gib": (memory.verify_peak_bytes or 0) / GIB})
        print(json.dumps(lines[-1]))
        if taken is not None:
            assert taken <= limit, lines[-1]
        assert all(s.passed for s in result.input_sets), result.summary
    path = os.environ.get("KBMCP_CHECKS_LOG")
    if path:
        with Path(path).open("a") as fh:
            fh.writelines(json.dumps(line) + "\n" for line in lines)
    assert all("check" in result.phases_s for result in got.values()), lines
