"""The compile-only path with the real nvcc and host compiler, in the sandbox: load_inline sources
found statically and checked, without running the candidate."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from harness_helpers import fixture_source

from kb_mcp.harness.builds.allow_lists import tried_outside
from kb_mcp.harness.builds.builds import toolchain
from kb_mcp.harness.builds.compile_only import CompileOnly
from kb_mcp.harness.builds.toolchain import (
    build_target,
    diagnostics,
    inline_sources,
    machine_limit,
    missing_declarations,
    needs_torch_headers,
    nvrtc_capability,
)
from kb_mcp.harness.candidate import SourceUnit, static_units
from kb_mcp.harness.pool.pool import WorkerPool
from kb_mcp.harness.sandbox.sandbox import detect
from kb_mcp.kb.models import Verdict


def test_refused_flags_that_reach_outside_the_build_are_attempts_and_unknown_ones_mistakes() -> None:
    unit = SourceUnit(kind="load_inline", name="u", cuda_source='#include "/etc/passwd"\n#include <x.h\n',
                      cpp_source="#define F <cuda.h>\n#include F\n",
                      nvcc_options=["-keep", "-wrapper", "/bin/sh,-c,id"],
                      cflags=["-funroll-all-loops", "-fplugin=/tmp/p.so", "-Xlinker"], ldflags=["-lfoo", "-L/opt/x"])
    assert tried_outside(unit, ["/usr/include"]) == [
        "CUDA compiler flag -wrapper", "CUDA compiler flag /bin/sh,-c,id", "host compiler flag -fplugin=/tmp/p.so",
        "host compiler flag -Xlinker", "library folder /opt/x", '#include "/etc/passwd" (cuda_sources)',
        "#include F (computed, cpp_sources)"]
    honest = SourceUnit(kind="load_inline", name="h", cuda_source="#include <cuda.h>\n",
                        nvcc_options=["-keep", "-O3"], cflags=["-funroll-all-loops"])
    assert tried_outside(honest, ["/usr/include"]) == []


def test_a_dependency_pragma_naming_a_file_outside_is_refused_as_an_include_would_be() -> None:
    """`#pragma GCC dependency` (and its `_Pragma` spelling) opens the file it names: by absolute
    path, climbing out with `..`, or computed, it is refused and is an attempt; a relative name of
    the toolchain's headers is not."""
    cuda = ('#pragma GCC dependency "/home/u/.ssh/id_rsa"\n'
            '_Pragma("GCC dependency \\"../../../home/u/.ssh/id_rsa\\"") __global__ void k() {}\n')
    unit = SourceUnit(kind="load_inline", name="d", cuda_source=cuda,
                      cpp_source="#  pragma dependency KEY extra\n#pragma GCC dependency <cuda.h>\n#pragma once\n")
    assert tried_outside(unit, ["/usr/include"]) == [
        '#pragma GCC dependency "/home/u/.ssh/id_rsa" (cuda_sources)',
        '#pragma GCC dependency "../../../home/u/.ssh/id_rsa" (cuda_sources)',
        "#pragma GCC dependency KEY extra (computed, cpp_sources)"]


@pytest.mark.nvcc
def test_the_host_compiler_opens_the_file_a_dependency_pragma_names(tmp_path: Path) -> None:
    """Why the pragma is refused: the compiler reads the named file's date (and fails on a missing one)."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler here")
    source = tmp_path / "a.cpp"
    source.write_text(f'#pragma GCC dependency "{tmp_path / "newer"}"\nint f() {{ return 1; }}\n')
    (tmp_path / "newer").write_text("x")
    os.utime(source, (1, 1))  # older than the file it names
    done = subprocess.run([cxx, "-c", str(source), "-o", str(tmp_path / "a.o")], capture_output=True, text=True)
    assert done.returncode == 0 and "older than" in done.stderr, done.stderr
    (tmp_path / "newer").unlink()
    done = subprocess.run([cxx, "-c", str(source), "-o", str(tmp_path / "a.o")], capture_output=True, text=True)
    assert done.returncode != 0 and "newer" in done.stderr, done.stderr


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


@pytest.mark.nvcc
def test_an_nvrtc_source_using_host_math_macros_fails_as_nvrtc_fails(tmp_path) -> None:
    # nvcc's implicit cuda_runtime.h defines INFINITY; NVRTC on the GPU does not ("identifier is undefined")
    body = 'extern "C" __global__ void k(float* x) {\n    x[0] = -INFINITY;\n}\n'
    compiler = CompileOnly(tmp_path, detect())
    bare = compiler.compile([SourceUnit(kind="nvrtc", name="k", cuda_source=body)], "sm_90")
    assert not bare.ok and any("k.cu(2)" in m and "INFINITY" in m and "undefined" in m for m in bare.messages), \
        bare.messages
    spelled = body.replace("-INFINITY", "__int_as_float(0xff800000)")
    assert compiler.compile([SourceUnit(kind="nvrtc", name="k", cuda_source=spelled)], "sm_90").ok
    included = "#include <cuda_runtime.h>\n" + body  # NVRTC with its include path finds it too
    assert compiler.compile([SourceUnit(kind="nvrtc", name="k", cuda_source=included)], "sm_90").ok


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


# Compiler logs recorded on a machine with the CPU build of torch 2.13 and a CUDA 13 toolkit
# without cuSPARSE (the paths shortened).
TORCH = "/venv/lib/python3.11/site-packages/torch/include"
NO_CMAKE_MACROS = f"""In file included from {TORCH}/c10/cuda/CUDADeviceAssertionHost.h:4,
                 from {TORCH}/c10/cuda/CUDAException.h:4,
                 from {TORCH}/c10/cuda/CUDAFunctions.h:13,
                 from {TORCH}/c10/cuda/CUDAStream.h:8,
                 from cuda_sources:2:
{TORCH}/c10/cuda/CUDAMacros.h:9:10: fatal error: c10/cuda/impl/cuda_cmake_macros.h: No such file or directory
    9 | #include <c10/cuda/impl/cuda_cmake_macros.h>
      |          ^~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
compilation terminated.
"""
NO_CUSPARSE = f"""In file included from {TORCH}/ATen/cuda/CUDAContext.h:4,
                 from cpp_sources:1:
{TORCH}/ATen/cuda/CUDAContextLight.h:10:10: fatal error: cusparse.h: No such file or directory
   10 | #include <cusparse.h>
      |          ^~~~~~~~~~~~
compilation terminated.
"""
UNDECLARED = """cuda_sources(3): error: identifier "undeclared_y" is undefined
  __attribute__((global)) void k(float* x) { x[0] = undeclared_y; }
                                                    ^

1 error detected in the compilation of "cuda.cu".
"""
NOWHERE = """cuda_sources:2:10: fatal error: ATen/cuda/NoSuchHeader.h: No such file or directory
compilation terminated.
"""


def test_a_header_missing_under_one_the_candidate_named_is_the_machines_limit() -> None:
    note = machine_limit(NO_CMAKE_MACROS, torch_cuda_headers=False)
    assert note == ("c10/cuda/impl/cuda_cmake_macros.h, which <c10/cuda/CUDAStream.h> includes, is missing here "
                    "(torch here is the CPU build, without its CUDA headers)")
    assert machine_limit(NO_CUSPARSE, torch_cuda_headers=False) == (
        "cusparse.h, which <ATen/cuda/CUDAContext.h> includes, is missing here (this machine's toolchain lacks it)")
    # one header of the candidate's, no chain: the fatal error is in the header it named
    direct = f"In file included from cpp_sources:1:\n{TORCH}/c10/cuda/CUDAStream.h:4:10: fatal error: " \
             "cuda_runtime_api.h: No such file or directory\ncompilation terminated.\n"
    assert machine_limit(direct, torch_cuda_headers=True).startswith(
        "cuda_runtime_api.h, which <c10/cuda/CUDAStream.h> includes, is missing here")


def test_a_header_the_candidate_names_is_its_error_unless_known_to_exist_elsewhere() -> None:
    assert machine_limit(NOWHERE, torch_cuda_headers=False) == ""
    generated = "cuda_sources:1:10: fatal error: ATen/cuda/CUDAConfig.h: No such file or directory\n"
    assert machine_limit(generated, torch_cuda_headers=False).startswith("<ATen/cuda/CUDAConfig.h> is missing here")
    assert machine_limit(generated, torch_cuda_headers=True) == ""  # this torch has them: it does not exist
    edg = 'kernel.cu(3): catastrophic error: cannot open source file "curand_kernel.h"\n\n1 catastrophic error ' \
          'detected in the compilation of "kernel.cu".\nCompilation terminated.\n'
    assert machine_limit(edg, torch_cuda_headers=True).startswith("<curand_kernel.h> is missing here")
    library = "kernel.cu:3:10: fatal error: curand_kernel.h: No such file or directory\n"
    assert machine_limit(library, torch_cuda_headers=True) == (
        "<curand_kernel.h> is missing here (this machine's toolchain lacks it)")


def test_any_other_error_in_the_run_is_the_candidates() -> None:
    assert machine_limit(UNDECLARED, torch_cuda_headers=False) == ""
    assert machine_limit(UNDECLARED + NO_CUSPARSE, torch_cuda_headers=False) == ""
    assert machine_limit(NO_CUSPARSE + "cpp_sources:7:3: error: 'y' was not declared in this scope\n", False) == ""
    assert machine_limit("", torch_cuda_headers=False) == ""  # a failure that says nothing is not explained


# A load_inline candidate whose C++ and CUDA parts include torch's CUDA headers, as KernelBench
# solutions do for the current stream.
CUDA_HEADERS = """
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP = \"\"\"
#include <ATen/cuda/CUDAContext.h>
void launch_relu(const float* x, float* y, long long n);
torch::Tensor relu_forward(torch::Tensor x) {
    auto y = torch::empty_like(x);
    launch_relu(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
\"\"\"

CUDA = \"\"\"
#include <c10/cuda/CUDAStream.h>
__global__ void relu_kernel(const float* x, float* y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], BODY);
}
void launch_relu(const float* x, float* y, long long n) {
    relu_kernel<<<(unsigned)((n + 255) / 256), 256, 0, c10::cuda::getCurrentCUDAStream()>>>(x, y, n);
}
\"\"\"

_ext = load_inline(name="kbmcp_test_relu_cuda_headers", cpp_sources=CPP, cuda_sources=CUDA,
                   functions=["relu_forward"])


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.relu_forward(x)
"""


@pytest.mark.nvcc
@pytest.mark.slow
def test_torchs_cuda_headers_missing_here_is_needs_gpu_and_a_real_error_stays_a_compile_error(
        relu_problem, tmp_path) -> None:
    """Issue 24: on the CPU build of torch a candidate including c10/cuda or ATen/cuda headers was a
    compile_error (`c10/cuda/impl/cuda_cmake_macros.h: No such file`). It is this machine's limit."""
    with WorkerPool(tmp_path, no_cuda=True) as pool:
        if toolchain(pool.sandbox).torch_cuda_headers:
            pytest.skip("torch here has its CUDA headers: nothing is missing to test")
        limited = pool.verify(relu_problem, CUDA_HEADERS.replace("BODY", "0.0f"))
        assert limited.verdict == Verdict.needs_gpu, limited.summary
        [unit] = limited.compile.units
        assert unit.ok and "is missing here" in unit.limited and unit.limited in limited.summary
        assert "<c10/cuda/CUDAStream.h>" in unit.limited or "<ATen/cuda/CUDAContext.h>" in unit.limited
        # an undeclared name in the kernel: nvcc reports it wherever the headers are (here, the CUDA
        # part's headers would stop it first; the C++ part's alone do not)
        wrong = CUDA_HEADERS.replace("BODY", "undeclared_y").replace("#include <c10/cuda/CUDAStream.h>", "") \
            .replace("c10::cuda::getCurrentCUDAStream()", "0")
        bad = pool.verify(relu_problem, wrong)
        assert bad.verdict == Verdict.compile_error, bad.summary
        assert "undeclared_y" in bad.summary
        nowhere = pool.verify(relu_problem, CUDA_HEADERS.replace("c10/cuda/CUDAStream.h", "ATen/cuda/NoSuchHeader.h")
                              .replace("BODY", "0.0f"))
        assert nowhere.verdict == Verdict.compile_error and "NoSuchHeader.h" in nowhere.summary, nowhere.summary
