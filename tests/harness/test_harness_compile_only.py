"""The compile-only path with the real nvcc and host compiler, in the sandbox: load_inline sources
found statically and checked, without running the candidate."""

from __future__ import annotations

import pytest
from harness_helpers import fixture_source

from kb_mcp.harness.candidate import SourceUnit, static_units
from kb_mcp.harness.compile_only import CompileOnly
from kb_mcp.harness.pool import WorkerPool
from kb_mcp.harness.sandbox import detect
from kb_mcp.harness.toolchain import (
    build_target,
    diagnostics,
    inline_sources,
    missing_declarations,
    needs_torch_headers,
    nvrtc_capability,
)
from kb_mcp.kb.models import Verdict


def test_light_header_detection() -> None:
    assert not needs_torch_headers("#include <cuda_runtime.h>\n__global__ void k(float* x) {} // torch::Tensor in a "
                                   "comment")
    assert needs_torch_headers("torch::Tensor f(torch::Tensor x) { return x; }")
    assert needs_torch_headers("#include <ATen/cuda/CUDAContext.h>\n")
    assert needs_torch_headers("void f() { TORCH_CHECK(true, \"x\"); }")


def test_only_unknown_names_send_a_light_build_back_for_the_full_header() -> None:
    assert missing_declarations('cuda_sources(4): error: identifier "__half" is undefined')
    assert missing_declarations("cuda_sources:3:5: error: 'at' was not declared in this scope")
    assert not missing_declarations('cuda_sources(7): error: expected a ";"')


def test_inline_sources_mirror_load_inline_with_line_markers() -> None:
    unit = SourceUnit(kind="load_inline", name="e", cpp_source="int f();", cuda_source="__global__ void k() {}",
                      functions=["f"])
    main_cpp, cuda_cu = inline_sources(unit, light=False)
    assert main_cpp.startswith("#include <torch/extension.h>\n#line 1 \"cpp_sources\"\nint f();")
    assert 'm.def("f", torch::wrap_pybind_function(f), "f");' in main_cpp
    assert cuda_cu.splitlines()[:4] == ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>",
                                       '#line 1 "cuda_sources"']
    light_cu = inline_sources(unit, light=True)[1]
    assert "torch/types.h" not in light_cu and "cuda_runtime.h" in light_cu


def test_diagnostics_put_errors_first() -> None:
    log = "a.cu(3): warning #177-D: unused\nninja: build stopped\na.cu(9): error: x is undefined\n1 error detected"
    assert diagnostics(log) == ["a.cu(9): error: x is undefined", "1 error detected", "a.cu(3): warning #177-D: unused"]


@pytest.mark.nvcc
def test_nvrtc_units_compile_and_cache(tmp_path) -> None:
    ok = SourceUnit(kind="nvrtc", name="k", cuda_source='extern "C" __global__ void k(float* x) { x[0] = 1.f; }',
                    nvcc_options=["--use_fast_math", "-arch=compute_80"])  # arch options are nvcc's business here
    compiler = CompileOnly(tmp_path, detect())
    first = compiler.compile([ok], "sm_90")
    assert first.ok and not first.cached and first.units[0].kernels == ["k"]
    again = compiler.compile([ok], "90")
    assert again.ok and again.cached and again.arch == "sm_90"


def test_hopper_and_blackwell_build_for_their_arch_specific_targets() -> None:
    assert [build_target(a) for a in ("sm_90", "9.0", "sm_90a", "sm_100", "sm_120", "sm_89", "sm_80")] == [
        "sm_90a", "sm_90a", "sm_90a", "sm_100a", "sm_120a", "sm_89", "sm_80"]
    assert nvrtc_capability("sm_90") == "90a" and nvrtc_capability("sm_86") == "86"


@pytest.mark.nvcc
def test_wgmma_code_compiles_for_the_arch_specific_target_only(tmp_path) -> None:
    [unit] = static_units(fixture_source("linear_wgmma_tf32.py"))
    kernel = SourceUnit(kind="nvrtc", name="linear_wgmma", cuda_source=unit.cuda_source)  # the .cu part alone
    compiler = CompileOnly(tmp_path, detect())
    built = compiler.compile([kernel], build_target("sm_90"))
    assert built.ok and built.arch == "sm_90a", built.messages
    plain = compiler.compile([kernel], "sm_90")
    assert not plain.ok and any("wgmma" in m and "sm_90" in m for m in plain.messages), plain.messages


@pytest.mark.nvcc
def test_a_load_inline_wgmma_extension_compiles_for_the_arch_specific_target_alone(tmp_path) -> None:
    # `-arch=sm_90a -c` would embed compute_90 PTX too, where wgmma does not assemble; the GPU build has one target
    [unit] = static_units(fixture_source("linear_wgmma_tf32.py"))
    built = CompileOnly(tmp_path, detect()).compile([unit], build_target("sm_90"))
    assert built.ok and built.arch == "sm_90a", built.messages
    [cu] = built.units
    assert cu.precisions is not None and list(cu.precisions.values()) == [["tf32"]]


@pytest.mark.nvcc
@pytest.mark.slow
def test_load_inline_candidate_is_compiled_and_its_errors_point_at_its_lines(relu_problem, tmp_path) -> None:
    with WorkerPool(tmp_path, no_cuda=True) as pool:
        good = pool.verify(relu_problem, fixture_source("relu_inline.py"))
        assert good.verdict == Verdict.needs_gpu, good.summary
        [unit] = good.compile.units
        assert unit.kind == "load_inline" and unit.ok and unit.kernels == ["relu_kernel"]
        bad = pool.verify(relu_problem, fixture_source("relu_inline_cuda_error.py"))
        assert bad.verdict == Verdict.compile_error
        assert any("cuda_sources(" in m and "error" in m for m in bad.compile.messages), bad.compile.messages
        assert bad.compile.seconds < good.compile.seconds  # the unchanged C++ part came from the cache
