"""Static integrity checks: every rule fires on the construct it names, at the right line, and
stays quiet on harmless code (a `pass`, a re-raising except, a comment or docstring that merely
mentions a banned name, the example candidates)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kb_mcp.harness.judgment.integrity_static import check_source, expand_allow
from kb_mcp.harness.judgment.verdict import FindingCode

ROOT = Path(__file__).resolve().parents[2]
C = FindingCode


def _src(body: str) -> str:
    return textwrap.dedent(body).lstrip("\n")


def _codes(source: str, allow: tuple[str, ...] = ()) -> set[tuple[FindingCode, int | None]]:
    return {(f.code, f.line) for f in check_source(_src(source), allow)}


HEADER = """
import torch
import torch.nn as nn
import torch.nn.functional as F
"""


def _model(forward_body: str, extra: str = "", init_body: str = "pass") -> str:
    """A candidate file: imports, `extra` module-level code, then ModelNew with the given bodies."""
    model = _src(
        """
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                INIT

            def forward(self, x):
        """
    ).replace("INIT", init_body)
    source = _src(HEADER) + _src(extra) + "\n\n" + model + textwrap.indent(_src(forward_body), " " * 8)
    compile(source, "candidate.py", "exec")  # a test source that does not parse would prove nothing
    return source


def _line_of(source: str, needle: str) -> int:
    for i, line in enumerate(source.splitlines(), 1):
        if needle in line:
            return i
    raise AssertionError(f"{needle!r} not in source")


# ---------------------------------------------------------------------------------------------
# Quiet on honest code


@pytest.mark.parametrize("path", sorted((ROOT / "examples" / "candidates").glob("*.py")), ids=lambda p: p.name)
def test_example_candidates_have_no_findings(path: Path) -> None:
    assert check_source(path.read_text()) == []


def test_harmless_constructs_do_not_fire() -> None:
    source = _model(
        '''
        """Unlike torch.matmul or cublasSgemm, this calls our kernel; try/except is not used."""
        # torch.matmul(x, x) would be a library call; a comment is not code
        seen = set()
        seen.add(1)
        order = [3, 1, 2]
        order.sort()
        biggest = max(order)
        try:
            n = x.numel()
        except RuntimeError as exc:
            raise ValueError("bad input") from exc
        try:
            pass
        except Exception:
            raise
        out = torch.empty_like(x)
        y = x.contiguous().view(-1)
        stream = torch.cuda.current_stream()
        if n == 0:
            pass
        return out
        ''',
        extra='import os\nos.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"',
    )
    source += _src(
        '''

        if __name__ == "__main__":
            print(Model, get_inputs(), torch.matmul)
        '''
    )
    assert check_source(source) == [], check_source(source)


def test_cpp_comments_and_strings_are_not_code() -> None:
    source = _model(
        "return x",
        extra=_src(
            '''
            CUDA = r"""
            // Unlike cublasSgemm or at::matmul(a, b), this kernel is ours.
            /* cudaStreamCreate(&s); std::thread t; */
            __global__ void k(float* y) { const char* msg = "see http://example.com"; y[0] = 1.0f; }
            """
            '''
        ),
    )
    assert check_source(source) == []


def test_syntax_error_yields_no_findings() -> None:
    assert check_source("def broken(:\n") == []


# ---------------------------------------------------------------------------------------------
# Library calls on the forward path


@pytest.mark.parametrize(
    "line, extra",
    [
        ("return torch.matmul(x, x)", ""),
        ("return F.gelu(x)", ""),
        ("return mm(x, x)", "mm = torch.matmul"),
        ("return matmul(x, x)", "from torch import matmul"),
        ("return fn.softmax(x, dim=1)", "from torch.nn import functional as fn"),
        ("return x @ x", ""),
        ("return x.softmax(dim=-1)", ""),
        ("return torch.ops.aten.mm.default(x, x)", ""),
        ("return nn.ReLU()(x)", ""),
        ("return torch.exp(x)", ""),
    ],
)
def test_library_calls_in_forward(line: str, extra: str) -> None:
    source = _model(line, extra=extra)
    found = check_source(source)
    lineno = _line_of(source, line)
    assert (C.library_call, lineno) in {(f.code, f.line) for f in found}, found
    assert all(f.message.startswith(f"line {f.line}:") for f in found)


def test_library_call_in_reachable_helper_only() -> None:
    source = _src(HEADER) + _src(
        """
        def used(x):
            return torch.exp(x)

        def unused(x):
            return torch.log(x)

        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.randn(4, 4).t().contiguous() * 2)

            def forward(self, x):
                return self._go(x)

            def _go(self, x):
                return used(x)
        """
    )
    found = {(f.code, f.line) for f in check_source(source)}
    assert found == {(C.library_call, _line_of(source, "torch.exp"))}


def test_nn_layer_attribute_called_in_forward_and_allow_list() -> None:
    source = _model("return self.fc(x)", init_body="self.fc = nn.Linear(4, 4)")
    assert {f.code for f in check_source(source)} == {C.library_call}
    assert check_source(source, ["gemm"]) == []
    assert check_source(source, ["torch.nn.functional.linear"]) == []
    assert check_source(_model("return torch.matmul(x, x)"), ["gemm"]) == []
    assert check_source(_model("return torch.matmul(x, x)"), ["aten::matmul"]) == []
    assert {f.code for f in check_source(_model("return torch.matmul(x, x)"), ["conv"])} == {C.library_call}


BUILD = 'load_inline(name="e", cpp_sources="", cuda_sources="__global__ void k(float* y) { y[0] = 1.0f; }")'


@pytest.mark.parametrize(
    "line, extra, init",
    [
        ("return _ext.relu(x)", f"from torch.utils.cpp_extension import load_inline\n_ext = {BUILD}", "pass"),
        ("return ext.softmax(x, 1)", 'ext = torch.utils.cpp_extension.load(name="e", sources=["e.cu"])', "pass"),
        ("return _module().sum(x)",
         f"import functools\nfrom torch.utils.cpp_extension import load_inline\n\n\n"
         f"@functools.lru_cache(None)\ndef _module():\n    return {BUILD}", "pass"),
        ("return self.ext.relu(x)", "from torch.utils.cpp_extension import load_inline", f"self.ext = {BUILD}"),
        ("return _get().mean(x)",
         f"from torch.utils.cpp_extension import load_inline\n_ext = None\n\n\ndef _get():\n    global _ext\n"
         f"    if _ext is None:\n        _ext = {BUILD}\n    return _ext", "pass"),
        ("return _k.sum(x)", '_k = torch.cuda._compile_kernel("extern \\"C\\" __global__ void k() {}", "k")', "pass"),
    ],
    ids=["module-level", "cpp_extension.load", "cached-builder", "model-attribute", "global-in-getter", "nvrtc"],
)
def test_functions_of_the_candidates_own_extension_are_not_tensor_ops(line: str, extra: str, init: str) -> None:
    """`_ext.relu(x)` calls the candidate's own kernel, not the tensor method `.relu()`."""
    source = _model(line, extra=extra, init_body=init)
    assert check_source(source) == [], check_source(source)


def test_a_tensor_that_shadows_an_extension_name_is_still_a_tensor() -> None:
    extra = f"from torch.utils.cpp_extension import load_inline\nx = {BUILD}\n_ext = {BUILD}"
    shadowed = _model("return x.relu()", extra=extra)
    assert {(f.code, f.line) for f in check_source(shadowed)} == {(C.library_call, _line_of(shadowed, "x.relu()"))}
    result = _model("y = _ext.chain(x)\nreturn y.relu()", extra=extra)
    assert {(f.code, f.line) for f in check_source(result)} == {(C.library_call, _line_of(result, "y.relu()"))}


def test_expand_allow_normalises_spellings() -> None:
    assert expand_allow(["torch.matmul", "aten::mm", "aten.addmm.default", "F.linear", " "]) == {
        "matmul", "mm", "addmm", "linear"
    }
    assert {"mm", "linear", "cublas"} <= expand_allow(["GEMM"])
    assert {"conv2d", "cudnn"} <= expand_allow(["conv"])


# ---------------------------------------------------------------------------------------------
# Fallbacks and the reference


def test_try_except_fallback_in_forward() -> None:
    source = _model(
        """
        try:
            return self.kernel(x)
        except Exception:
            return F.relu(x)
        """
    )
    found = {(f.code, f.line) for f in check_source(source)}
    assert (C.reference_fallback, _line_of(source, "except Exception")) in found
    assert (C.library_call, _line_of(source, "F.relu")) in found


def test_try_except_around_build_that_swallows_errors() -> None:
    source = _model(
        "return x",
        extra=_src(
            """
            from torch.utils.cpp_extension import load_inline
            try:
                ext = load_inline(name="e", cpp_sources="")
                HAVE_EXT = True
            except Exception:
                HAVE_EXT = False
            """
        ),
    )
    assert (C.reference_fallback, _line_of(source, "except Exception")) in _codes(source)


def test_reference_model_use_and_subclass() -> None:
    source = _src(
        """
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, x):
                return x

        class ModelNew(Model):
            pass
        """
    )
    assert (C.reference_fallback, _line_of(source, "class ModelNew")) in _codes(source)
    calls = _model("return self.ref(x)", init_body="self.ref = Model()")
    assert (C.reference_fallback, _line_of(calls, "Model()")) in _codes(calls)
    imported = "from problem import Model, get_inputs\n"
    assert C.reference_fallback in {f.code for f in check_source(imported)}


# ---------------------------------------------------------------------------------------------
# Tampering, settings, seeds


@pytest.mark.parametrize(
    "stmt, code",
    [
        ("torch.cuda.synchronize = lambda: None", C.harness_tampering),
        ("time.perf_counter = lambda: 0.0", C.harness_tampering),
        ('setattr(torch, "allclose", lambda *a, **k: True)', C.harness_tampering),
        ("Event.elapsed_time = lambda self, end: 0.001", C.harness_tampering),
        ("torch.Tensor.__eq__ = lambda a, b: True", C.harness_tampering),
        ('sys.modules["time"] = None', C.harness_tampering),
        ("torch.backends.cuda.matmul.allow_tf32 = True", C.precision_lowered),
        ('torch.set_float32_matmul_precision("medium")', C.precision_lowered),
        ("torch.manual_seed(42)", C.seed_prediction),
        ("state = torch.cuda.get_rng_state()", C.seed_prediction),
        ("objs = gc.get_objects()", C.harness_tampering),
        ("caller = sys._getframe(1).f_locals", C.harness_tampering),
        ("torch.cuda.empty_cache()", C.harness_tampering),
        ("os.write(5, b'x')", C.forged_result),
        ("compiled = torch.compile(lambda t: t * 2)", C.library_call),
        ("modes = torch.utils._python_dispatch._disable_current_modes()", C.harness_tampering),
        ("guard = torch._C._DisableTorchDispatch()", C.harness_tampering),
    ],
)
def test_file_level_rules(stmt: str, code: FindingCode) -> None:
    source = _src(
        """
        import gc
        import os
        import sys
        import time
        import torch
        from torch.cuda import Event
        """
    ) + stmt + "\n"
    found = check_source(source)
    assert (code, 7) in {(f.code, f.line) for f in found}, found


@pytest.mark.parametrize(
    "snippet, code",
    [
        ("import threading\nthreading.Thread(target=print).start()\n", C.background_thread),
        ("import torch\ns = torch.cuda.Stream()\n", C.unsynchronized_work),
        ("import socket\n", C.forged_result),
        ("import multiprocessing.connection\n", C.forged_result),
        ("import ctypes\n", C.harness_tampering),
        ("from unittest import mock\n", C.harness_tampering),
        ("import torch\nclass Lazy(torch.Tensor):\n    pass\n", C.wrong_output_type),
        ("class Lazy:\n    def __torch_function__(self, *a):\n        return 0\n", C.wrong_output_type),
        ("lib = object()\nlib.cuCtxSetLimit(6, 1 << 20)\n", C.l2_persistence),
    ],
)
def test_more_file_level_rules(snippet: str, code: FindingCode) -> None:
    assert code in {f.code for f in check_source(snippet)}


# ---------------------------------------------------------------------------------------------
# C++ / CUDA source in strings


def _cuda_candidate(body: str) -> str:
    source = _src(
        '''
        import torch
        CUDA = r"""
        #include <cuda_runtime.h>
        __global__ void k(float* y) { y[0] = 1.0f; }
        '''
    ) + _src(body) + '"""\n'
    compile(source, "candidate.py", "exec")
    return source


@pytest.mark.parametrize(
    "cpp, code, allow",
    [
        ("void f(cublasHandle_t h) { cublasSgemm(h); }", C.library_call, ()),
        ("#include <cudnn.h>", C.library_call, ()),
        ("torch::Tensor f(torch::Tensor a) { return at::matmul(a, a); }", C.library_call, ()),
        ("torch::Tensor f(torch::Tensor a) { return a.softmax(0); }", C.library_call, ()),
        ("void f() { cudaStream_t s; cudaStreamCreate(&s); }", C.unsynchronized_work, ()),
        ("void f() { std::thread t([]{}); t.detach(); }", C.background_thread, ()),
        ("void f() { cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 1 << 20); }", C.l2_persistence, ()),
        ("void f(cudaStreamAttrValue v) { v.accessPolicyWindow.num_bytes = 1; }", C.l2_persistence, ()),
    ],
)
def test_cpp_rules_with_line_numbers(cpp: str, code: FindingCode, allow: tuple[str, ...]) -> None:
    source = _cuda_candidate(cpp + "\n")
    found = check_source(source, allow)
    assert (code, _line_of(source, cpp)) in {(f.code, f.line) for f in found}, found


def test_cublas_allowed_by_gemm_group() -> None:
    source = _cuda_candidate("#include <cublas_v2.h>\nvoid f(cublasHandle_t h) { cublasSgemm(h); }\n")
    assert {f.code for f in check_source(source)} == {C.library_call}
    assert check_source(source, ["gemm"]) == []


def test_allocation_in_cpp_is_fine() -> None:
    source = _cuda_candidate("torch::Tensor f(torch::Tensor a) { return torch::empty_like(a); }\n")
    assert check_source(source) == []
