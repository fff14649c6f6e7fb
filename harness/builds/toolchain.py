"""The compiler runs built from what a candidate asked for, and what they tell (server side, pure).

Shared by the compile-only path (`harness.builds.compile_only`), the build service
(`harness.builds.builds`) and the worker's builders (`harness.worker.compile`): the toolchain a worker
reports (`ToolchainInfo`), the text `load_inline` would compile (`inline_sources`), the content-hash
name of a built extension (`extension_name`), the compiler runs that check a unit without a GPU
(`compile_runs`), compiler-log helpers, and which missing headers are this machine's limit
(`machine_limit`). What a candidate may ask of the compilers (the flag and include allow-lists) is
`harness.builds.allow_lists`'.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.harness.builds.allow_lists import NVRTC_ONLY, joined_flags
from kb_mcp.harness.candidate import SourceUnit

DEFAULT_ARCH = "sm_90"
LOG_LIMIT = 20_000  # characters of compiler output kept per unit
MESSAGE_LIMIT = 12  # diagnostic lines in CompileResult.messages


class ToolchainInfo(BaseModel):
    """The compilers as the sandbox sees them (`python -m kb_mcp.harness.worker.build --probe`)."""

    model_config = ConfigDict(extra="forbid")

    torch_version: str
    includes: list[str]  # torch's C++ include folders and Python's
    std: str  # the C++ standard torch builds with
    nvcc_common: list[str]  # torch's COMMON_NVCC_FLAGS
    abi: int  # _GLIBCXX_USE_CXX11_ABI
    nvcc: str | None  # path, or None when there is no nvcc
    cxx: str
    nvcc_version: str = ""
    include_roots: list[str] = Field(default_factory=list)  # folders an include folder may lie in
    cuobjdump: str | None = None  # path, or None: the SASS of built code cannot be read (`harness.judgment.precision`)
    nvdisasm: str | None = None  # what cuobjdump runs to print SASS
    # The CUDA toolkit's include folder, which load_inline gives the host compiler of a CUDA
    # extension (torch's `include_paths("cuda")`); empty where there is no toolkit.
    cuda_includes: list[str] = Field(default_factory=list)
    # Whether torch here has its CUDA headers (the CPU build of torch lacks the ones a CUDA build
    # generates, `TORCH_CUDA_BUILD_ONLY`): a candidate that needs them cannot be compiled here.
    torch_cuda_headers: bool = True

    @property
    def ident(self) -> str:
        """What compile-only results are keyed by besides the source."""
        return f"{self.torch_version}|{self.nvcc_version}"



# ---------------------------------------------------------------------------------------------
# What load_inline compiles, and under which name


def content_hash(*parts: object) -> str:
    """16 hex digits of SHA-256 over the JSON of the parts."""
    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def truncate(text: str, limit: int = LOG_LIMIT) -> str:
    """Head and tail of `text`, at most about `limit` characters."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters omitted ...]\n{text[-half:]}"


def safe_name(name: str) -> str:
    """A name usable as a C identifier and file name."""
    cleaned = re.sub(r"\W", "_", name)[:40] or "ext"
    return cleaned if not cleaned[0].isdigit() else f"x{cleaned}"


def cuda_arch_list(arch: str) -> str:
    """`sm_90` -> `9.0`, `sm_90a` -> `9.0a` (TORCH_CUDA_ARCH_LIST's spelling)."""
    m = re.match(r"^(?:sm_|compute_)?(\d+)(\d)([af]?)$", arch.strip().lower())
    if not m:
        raise ValueError(f"not a CUDA arch: {arch!r}")
    return f"{m.group(1)}.{m.group(2)}{m.group(3)}"


def arch_flag(arch: str) -> str:
    """`sm_90` / `90` / `9.0` -> `sm_90` (`sm_90a` stays `sm_90a`)."""
    a = arch.strip().lower().replace("sm_", "").replace("compute_", "").replace(".", "")
    return f"sm_{a}"


# GPUs with an arch-specific target (the `a` suffix): code built for it may use the features of
# that one GPU generation that are not carried forward, such as Hopper's `wgmma` and TMA
# instructions (sm_90a) or Blackwell's `tcgen05` (sm_100a). CUDA C++ Programming Guide,
# "Feature Availability" (architecture-specific features); sm_101 was renamed sm_110 in CUDA 13.
ARCH_SPECIFIC = frozenset({"sm_90", "sm_100", "sm_101", "sm_103", "sm_110", "sm_120", "sm_121"})


def build_target(arch: str) -> str:
    """What the harness builds for a GPU of `arch`: its arch-specific target where it has one
    (`sm_90` -> `sm_90a`), else `arch` itself. Builds run only on the GPU they were built for, so
    nothing is lost, and `wgmma`/TMA code compiles."""
    flag = arch_flag(arch)
    return f"{flag}a" if flag in ARCH_SPECIFIC else flag


def nvrtc_capability(arch: str) -> str:
    """The `compute_capability` NVRTC is given for a GPU of `arch` (`sm_90` -> `90a`): torch's
    `_compile_kernel` turns it into `--gpu-architecture=sm_<it>`."""
    return build_target(arch).removeprefix("sm_")


# The CUDA source needs PyTorch's C++ headers when it names any of these.
_TORCH_API = re.compile(
    r"\b(torch|at|c10|caffe2|pybind11)::|\bTORCH_\w+|\bAT_\w+|\bC10_\w+|\bTensor\b|\bPYBIND11\w*|#\s*include\s*[<\"](torch|ATen|c10)/"
)


def needs_torch_headers(cuda_source: str) -> bool:
    """True when CUDA source refers to PyTorch's C++ API (and so needs `torch/types.h`)."""
    return bool(_TORCH_API.search(re.sub(r"//[^\n]*|/\*.*?\*/", " ", cuda_source, flags=re.S)))


def light_variants(unit: SourceUnit) -> list[bool]:
    """The header variants to try, in order: without torch/types.h first when the CUDA source
    uses nothing of torch's C++ API (the same code, tens of seconds faster to build)."""
    light_ok = bool(unit.cuda_source) and unit.implicit_headers and not needs_torch_headers(unit.cuda_source)
    return [True, False] if light_ok else [False]


def inline_sources(unit: SourceUnit, light: bool) -> tuple[str, str]:
    """(main.cpp, cuda.cu) text as load_inline would write them; `light` drops torch/types.h from cuda.cu.

    `#line` directives make compiler messages point at lines of the candidate's own strings
    (`cpp_sources:12`, `cuda_sources:40`).
    """
    cpp: list[str] = ["#include <torch/extension.h>"] if unit.implicit_headers else []
    cpp += ['#line 1 "cpp_sources"', unit.cpp_source]
    if unit.functions:
        cpp.append("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {")
        for fn in unit.functions:
            wrapped = f"torch::wrap_pybind_function({fn})" if unit.error_handling else fn
            cpp.append(f'm.def("{fn}", {wrapped}, "{fn}");')
        cpp.append("}")
    cuda = ""
    if unit.cuda_source:
        heads: list[str] = []
        if unit.implicit_headers:
            heads = (["#include <torch/types.h>"] if not light else []) + ["#include <cuda.h>",
                                                                           "#include <cuda_runtime.h>"]
        cuda = "\n".join(heads + ['#line 1 "cuda_sources"', unit.cuda_source]) + "\n"
    return "\n".join(cpp) + "\n", cuda


def extension_name(unit: SourceUnit, light: bool, torch_version: str, arch: str) -> str:
    """The name a built extension has in the shared cache: the content hash of everything that
    goes into the build, so an identical candidate is a cache hit and a changed one never reuses
    a stale build."""
    main_cpp, cuda_cu = inline_sources(unit, light)
    key = content_hash(main_cpp, cuda_cu, unit.cflags, unit.nvcc_options, unit.ldflags, unit.include_dirs,
                       torch_version, arch_flag(arch), unit.with_cuda, unit.python_module)
    return f"{safe_name(unit.name)}_{key}"


# ---------------------------------------------------------------------------------------------
# Compiler logs

_DIAG = re.compile(r"\b(error|warning)\b", re.I)
_MISSING_DECL = re.compile(
    r"is undefined|was not declared|undeclared|incomplete type|has no member|no instance of|not a template|"
    r"unknown type name|does not name a type|is not a member",
    re.I,
)


def diagnostics(log: str, limit: int = MESSAGE_LIMIT) -> list[str]:
    """Error lines first, then warnings, from a compiler log (one line each, deduplicated)."""
    errors: list[str] = []
    warnings: list[str] = []
    for raw in log.splitlines():
        line = raw.strip()
        if not line or line.startswith(("[", "FAILED:", "ninja:", "/usr/bin", "c++ ", "nvcc ")) or len(line) > 600:
            continue
        m = _DIAG.search(line)
        if not m:
            continue
        bucket = errors if m.group(1).lower() == "error" else warnings
        if line not in bucket:
            bucket.append(line)
    return (errors + warnings)[:limit]


def missing_declarations(log: str) -> bool:
    """True when a failed light-header build complains of unknown names (which torch/types.h might
    declare); other errors (syntax, types) would fail the same way with the full header."""
    return bool(_MISSING_DECL.search(log))


# ---------------------------------------------------------------------------------------------
# Compile-only: the compiler runs that check a unit without building it


class CompilerRun(BaseModel):
    """One compiler run checking part of a unit: its source file and argv (relative to its folder)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    label: str  # nvcc | c++
    filename: str
    text: str
    argv: tuple[str, ...]

    def key(self, toolchain: str) -> str:
        """What its result is cached under."""
        return content_hash(self.label, self.filename, self.text, self.argv, toolchain)


# Macros that nvcc's implicit `cuda_runtime.h` brings in from the host's <math.h>, which NVRTC does
# not define: a kernel using them builds with nvcc and fails under NVRTC on the GPU ("identifier
# INFINITY is undefined"), so the check with nvcc undefines them first.
_HOST_MATH_MACROS = ("INFINITY", "NAN", "HUGE_VAL", "HUGE_VALF", "HUGE_VALL", "M_E", "M_LOG2E", "M_LOG10E", "M_LN2",
                     "M_LN10", "M_PI", "M_PI_2", "M_PI_4", "M_1_PI", "M_2_PI", "M_2_SQRTPI", "M_SQRT2", "M_SQRT1_2")
_MATH_INCLUDE = re.compile(r"^\s*#\s*include\s*[<\"](?:math\.h|cmath|cuda_runtime\.h|math_constants\.h)[>\"]", re.M)


def nvrtc_view(source: str) -> str:
    """An NVRTC source as nvcc must see it to judge it as NVRTC will: the host math macros nvcc
    defines on its own undefined (unless the source includes those headers itself), line numbers kept."""
    if _MATH_INCLUDE.search(source):
        return source
    undefs = "".join(f"#undef {m}\n" for m in _HOST_MATH_MACROS)
    return f"{undefs}#line 1\n{source}"


def compile_runs(unit: SourceUnit, arch: str, tc: ToolchainInfo, light: bool) -> list[CompilerRun]:
    """The compiler runs that check `unit` (NVRTC source: nvcc; load_inline: nvcc and the host
    compiler). The flags must have passed `flag_refusals`."""
    nvcc = tc.nvcc or "nvcc"
    if unit.kind == "nvrtc":
        name = f"{safe_name(unit.name)}.cu"
        opts = [o for o in joined_flags(unit.nvcc_options) if not NVRTC_ONLY.match(o)]
        if not any(o.startswith(("-std", "--std")) for o in opts):
            opts.append("-std=c++17")
        incs = [f"-I{d}" for d in unit.include_dirs]
        return [CompilerRun(label="nvcc", filename=name, text=nvrtc_view(unit.cuda_source),
                            argv=(nvcc, f"-arch={arch}", "-cubin", "-o", "kernel.cubin", *incs, *opts, name))]
    main_cpp, cuda_cu = inline_sources(unit, light)
    defines = [f"-DTORCH_EXTENSION_NAME={safe_name(unit.name)}", "-DTORCH_API_INCLUDE_EXTENSION_H",
               f"-D_GLIBCXX_USE_CXX11_ABI={tc.abi}"]
    sys_incs = [x for inc in tc.includes + unit.include_dirs for x in ("-isystem", inc)]
    runs: list[CompilerRun] = []
    if cuda_cu:
        cuda_flags = joined_flags(unit.nvcc_options)
        if not any(f.startswith(("-std", "--std")) for f in cuda_flags):
            cuda_flags.append(f"-std={tc.std}")
        # One target, as the GPU build (TORCH_CUDA_ARCH_LIST) has: `-arch=sm_90a -c` would also embed
        # compute_90 PTX, where wgmma does not assemble.
        target = f"-gencode=arch=compute_{arch.removeprefix('sm_')},code={arch}"
        runs.append(CompilerRun(label="nvcc", filename="cuda.cu", text=cuda_cu, argv=(
            nvcc, target, "-c", "-o", "cuda.o", *defines, *sys_incs, *tc.nvcc_common,
            "--compiler-options", "-fPIC", *cuda_flags, "cuda.cu")))
    with_cuda = unit.with_cuda if unit.with_cuda is not None else bool(unit.cuda_source)
    host_incs = sys_incs + [x for inc in (tc.cuda_includes if with_cuda else []) for x in ("-isystem", inc)]
    runs.append(CompilerRun(label="c++", filename="main.cpp", text=main_cpp, argv=(
        tc.cxx, "-fsyntax-only", *defines, *host_incs, "-fPIC", f"-std={tc.std}", *joined_flags(unit.cflags),
        "main.cpp")))
    return runs


# ---------------------------------------------------------------------------------------------
# Headers missing on this machine: its limit, not the candidate's error

# Headers a CUDA build of torch generates and the CPU build lacks (the CPU build ships the rest of
# torch's CUDA headers, which include these).
TORCH_CUDA_BUILD_ONLY = frozenset({"c10/cuda/impl/cuda_cmake_macros.h", "ATen/cuda/CUDAConfig.h"})
# Headers of the CUDA toolkit's libraries, which a toolkit installed without them lacks.
CUDA_LIBRARY_HEADERS = frozenset({
    "cublas.h", "cublas_v2.h", "cublasLt.h", "cublasXt.h", "cusparse.h", "cusparseLt.h", "cufft.h", "cufftXt.h",
    "curand.h", "curand_kernel.h", "curand_philox4x32_x.h", "cusolverDn.h", "cusolverSp.h", "cusolver_common.h",
    "cudnn.h", "cudnn_frontend.h", "nvrtc.h", "nccl.h", "nvToolsExt.h", "nvtx3/nvToolsExt.h", "nvjpeg.h", "npp.h",
    "cufile.h", "cutensor.h", "nvJitLink.h", "cusparse_v2.h", "cuda_runtime_api.h", "cuda_runtime.h", "cuda.h",
})
_INCLUDED_FROM = re.compile(r"^(?:In file included|\s+) from (?P<file>.+?):\d+[:,]\s*$")
_NO_SUCH = re.compile(r"^(?P<file>.+?):\d+(?::\d+)?: (?:fatal )?error: (?P<name>[^\s:]+): No such file or directory")
_CANNOT_OPEN = re.compile(r'^(?P<file>.+?)\(\d+\): catastrophic error: cannot open source file "(?P<name>[^"]+)"')
_ERROR_COUNT = re.compile(r"^\d+ (?:catastrophic )?errors? detected in the compilation of")  # nvcc's tally


def machine_limit(log: str, torch_cuda_headers: bool) -> str:
    """Why a failed compiler run says nothing against the candidate, or "" when it does.

    Only a header missing on this machine is its limit, and every error of the run must be one.
    A header is missing here, not nowhere, when a header the candidate named exists and one of its
    own includes does not (the compiler names the including file by its path in the toolchain's
    folders), or when the candidate names one directly that is known to exist elsewhere: one a CUDA
    build of torch generates where this torch lacks them (`TORCH_CUDA_BUILD_ONLY`), or one of a CUDA
    library (`CUDA_LIBRARY_HEADERS`). Any other header the candidate names and no folder has is
    its error, as is every other error.
    """
    notes: list[str] = []
    chain: list[str] = []
    for raw in log.splitlines():
        line = raw.rstrip()
        included = _INCLUDED_FROM.match(line)
        if included:
            chain.append(included.group("file"))
            continue
        missing = _NO_SUCH.match(line) or _CANNOT_OPEN.match(line)
        if missing:
            note = _missing_here(missing.group("name"), missing.group("file"), chain, torch_cuda_headers)
            if not note:
                return ""
            notes.append(note)
        elif _is_error(line):
            return ""  # an error of the candidate's own
        chain = []
    return "; ".join(dict.fromkeys(notes))


def _is_error(line: str) -> bool:
    """A compiler's error line (not a warning, nor nvcc's tally of the errors)."""
    m = _DIAG.search(line)
    return bool(m and m.group(1).lower() == "error" and diagnostics(line) and not _ERROR_COUNT.match(line.strip()))


def _header_name(path: str) -> str:
    """A toolchain header's path as a candidate names it (`c10/cuda/CUDAStream.h`)."""
    return path.rsplit("/include/", 1)[-1]


def _missing_here(name: str, where: str, chain: list[str], torch_cuda_headers: bool) -> str:
    """The note for header `name` missing, included from `where` (after the include `chain`,
    innermost first), or "" when that is the candidate's error."""
    torch_lacks = name in TORCH_CUDA_BUILD_ONLY and not torch_cuda_headers
    torch_cuda = torch_lacks or (not torch_cuda_headers and name.startswith(("c10/cuda/", "ATen/cuda/")))
    why = "torch here is the CPU build, without its CUDA headers" if torch_cuda else "this machine's toolchain lacks it"
    if os.path.isabs(where):  # a header of the toolchain's includes it: the candidate named one that exists
        own = [f for f in chain if not os.path.isabs(f)]
        named = chain[chain.index(own[0]) - 1] if own and chain.index(own[0]) > 0 else where
        return f"{name}, which <{_header_name(named)}> includes, is missing here ({why})"
    if torch_lacks or name in CUDA_LIBRARY_HEADERS:
        return f"<{name}> is missing here ({why})"
    return ""
