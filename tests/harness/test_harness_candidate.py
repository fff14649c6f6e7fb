"""Reading candidates without running them: ModelNew present, CUDA sources found, kernel names."""

from __future__ import annotations

import pytest

from kb_mcp.harness.candidate import (
    CandidateError,
    inline_unit,
    inline_units_ahead,
    kernel_names,
    parse_candidate,
    static_units,
    style_of,
)


def test_missing_model_new_and_syntax_errors_are_named() -> None:
    with pytest.raises(CandidateError, match="no top-level `class ModelNew`"):
        parse_candidate("import torch\nclass Model: pass\n")
    with pytest.raises(CandidateError, match="syntax error at line 2"):
        parse_candidate("class ModelNew:\n    def f(:\n")
    with pytest.raises(CandidateError, match="empty"):
        parse_candidate("   \n")
    parse_candidate("class ModelNew:\n    pass\n")  # fine


def test_kernel_names_handle_qualifiers_templates_and_comments() -> None:
    src = r'''
    // __global__ void commented_out(float* x) {}
    extern "C" __global__ void plain(const float* x) {}
    __global__ void __launch_bounds__(256, 2) bounded(float* y) {}
    template <int N> __global__ void templ(float* z) {}
    __device__ float helper(float v) { return v; }
    /* __global__ void also_commented() {} */
    '''
    assert kernel_names(src) == ["plain", "bounded", "templ"]


def test_static_units_resolve_constants_concatenation_and_keywords() -> None:
    src = '''
import torch
from torch.utils.cpp_extension import load_inline
HEAD = "#include <cuda_runtime.h>\\n"
BODY = 'extern "C" __global__ void k1(float* x) { x[0] = 1.f; }'
CPP = ["torch::Tensor f(torch::Tensor x);"]
k = torch.cuda._compile_kernel(HEAD + BODY, "k1", nvcc_options=["--use_fast_math"])
ext = load_inline(name="e", cpp_sources=CPP, cuda_sources=[HEAD, "__global__ void k2(float* y) {}"],
                  functions=["f"], extra_cuda_cflags=["-O3"])
dynamic = torch.cuda._compile_kernel(make_source(), "k3")  # not static: skipped
class ModelNew: pass
'''
    units = static_units(src)
    assert [(u.kind, u.name) for u in units] == [("nvrtc", "k1"), ("load_inline", "e")]
    nvrtc, inline = units
    assert nvrtc.cuda_source.startswith("#include <cuda_runtime.h>\n") and "k1" in nvrtc.cuda_source
    assert nvrtc.nvcc_options == ["--use_fast_math"] and nvrtc.line == 7
    assert "k2" in inline.cuda_source and inline.functions == ["f"] and inline.nvcc_options == ["-O3"]
    assert inline.cpp_source == "torch::Tensor f(torch::Tensor x);"
    assert style_of(units) == "mixed" and style_of(units[:1]) == "nvrtc" and style_of([]) == "none"


def test_calls_whose_arguments_are_not_certain_are_left_to_the_worker() -> None:
    """What a build ahead cannot read for certain it does not build (the worker builds it on demand)."""
    head = "from torch.utils.cpp_extension import load_inline\nSRC = 'int f();'\n"
    left_out = [
        "def build(src):\n    return load_inline(name='a', cpp_sources=src)\n",  # a parameter
        "SRC2 = SRC\nSRC2 = SRC2 + 'x'\nload_inline(name='b', cpp_sources=SRC2)\n",  # bound twice
        "FLAGS = ['-O2']\nFLAGS.append('-O3')\nload_inline(name='c', cpp_sources=SRC, extra_cflags=FLAGS)\n",
        "load_inline(name=f'd{1.5:.0f}', cpp_sources=SRC)\n",  # a formatted f-string
        "opts = {}\nload_inline(name='e', cpp_sources=SRC, **opts)\n",
        "load_inline(name='f', cpp_sources=SRC, is_python_module=None)\n",  # read as bool(None) by the worker
        "load_inline(name='g', cpp_sources=SRC, functions={'f': 'doc'})\n",
        "load_inline(name='h', cpp_sources=SRC, extra_cflags=[1])\n",
        "import os\nload_inline(name=os.environ['X'], cpp_sources=SRC)\n",
    ]
    for body in left_out:
        assert inline_units_ahead(head + body) == [], body
    kept = inline_units_ahead(head + "load_inline(name='k', cpp_sources=SRC, extra_cflags=['-O2'], verbose=True)\n")
    assert [u.name for u in kept] == ["k"] and kept[0].cflags == ["-O2"]


def test_a_positional_call_is_read_by_load_inlines_own_parameter_order() -> None:
    """torch's load_inline takes sycl_sources fourth: a positional `functions` is the fifth argument."""
    source = ("from torch.utils.cpp_extension import load_inline\n"
              "load_inline('p', 'int f();', '__global__ void k() {}', None, ['f'], ['-O1'], ['-O3'])\n")
    [ahead] = inline_units_ahead(source)
    [static] = static_units(source)
    expected = inline_unit({"name": "p", "cpp_sources": "int f();", "cuda_sources": "__global__ void k() {}",
                            "functions": ["f"], "extra_cflags": ["-O1"], "extra_cuda_cflags": ["-O3"]})
    assert ahead.model_dump(exclude={"line"}) == expected.model_dump(exclude={"line"})
    assert (static.functions, static.cflags, static.nvcc_options) == (["f"], ["-O1"], ["-O3"])
