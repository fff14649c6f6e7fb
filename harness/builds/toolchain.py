"""What a candidate may ask of the compilers, and the compiler runs built from it (server side, pure).

A candidate chooses compiler flags (`extra_cflags`, `extra_cuda_cflags`, `extra_ldflags`, NVRTC
options) and include folders, and its sources contain `#include` lines. Passed verbatim these are a
way out of any check: `-wrapper /bin/sh,-c,...` runs a command during a compile, `-include FILE` or
`#include "/absolute/path"` puts a private file into the compile log, `-fplugin=` loads code into
the compiler. So flags come from allow-lists (`refusals` lists what is not on them), include
folders must lie inside the toolchain's own include folders, and `#include` names must be plain
relative names (no absolute path, no `..`, no computed include). The sandbox the compilers run in
(`harness.sandbox.sandbox`) is the second wall; this module is the first, with messages that say what to
change.

Also here, shared by the compile-only path (`harness.builds.compile_only`), the build service
(`harness.builds.builds`) and the worker's builders (`harness.worker.compile`): the text `load_inline`
would compile (`inline_sources`), the content-hash name of a built extension
(`extension_name`), the compiler runs that check a unit without a GPU (`compile_runs`), and
compiler-log helpers.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field

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
# Allow-lists

_NO = r"(?:no-)?"
_DEFINE = r"-[DU][A-Za-z_][A-Za-z0-9_]*(?:=[A-Za-z0-9_.+\-*/()<>:,\" ]*)?"
# Host compiler flags (extra_cflags, and what -Xcompiler passes on).
_HOST = re.compile(
    r"^(?:"
    r"-O[0-3sg]?|-Ofast|-std=(?:c|gnu)\+\+(?:11|14|17|20|23|1z|2a|2b)|" + _DEFINE + r"|"
    r"-g[0-3]?|-w|-pthread|-fopenmp|-fPIC|-fpic|"
    r"-W" + _NO + r"[a-z][a-z0-9+-]*(?:=[a-z0-9-]+)?|"
    r"-f" + _NO + r"(?:fast-math|unroll-loops|strict-aliasing|tree-vectorize|vectorize|math-errno|finite-math-only|"
    r"omit-frame-pointer|inline-functions|permissive|exceptions|rtti|trapping-math|signed-zeros|"
    r"associative-math|reciprocal-math|unsafe-math-optimizations|diagnostics-color|"
    r"visibility-inlines-hidden)|"
    r"-fvisibility=(?:hidden|default)|-fdiagnostics-color=(?:always|never|auto)|-fabi-version=\d+|"
    r"-march=native|-mtune=native|-m(?:avx|avx2|fma|f16c|bmi2|avx512f|avx512bw|avx512vl|sse4\.2)"
    r")$"
)
_PTXAS = (r"(?:-v|-O[0-3]|--warn-on-spills|--warn-on-local-memory-usage|-dlcm=c[ag]|"
          r"--allow-expensive-optimizations=(?:true|false))")
_ARCH = r"(?:sm|compute)_\d{2,3}[af]?"
# nvcc flags (extra_cuda_cflags; NVRTC options that nvcc reads the same way).
_NVCC = re.compile(
    r"^(?:"
    r"-O[0-3]?|--?use_fast_math|-lineinfo|--generate-line-info|-g|-G|-w|"
    r"--?std=c\+\+(?:11|14|17|20)|" + _DEFINE + r"|"
    r"--?maxrregcount=\d+|--?(?:ftz|prec-div|prec-sqrt|fmad)=(?:true|false)|"
    r"--?extra-device-vectorization|--?restrict|"
    r"--?expt-relaxed-constexpr|--?expt-extended-lambda|--extended-lambda|"
    r"-Wno-deprecated-gpu-targets|-Wno-deprecated-declarations|--disable-warnings|-Werror=[a-z-]+|"
    r"--?res-usage|--resource-usage|--default-stream=(?:per-thread|legacy)|--threads=\d+|-t=?\d+|"
    r"-rdc=(?:true|false)|--relocatable-device-code=(?:true|false)|-dopt=(?:on|off)|"
    r"-arch=" + _ARCH + r"|--gpu-architecture=" + _ARCH + r"|-code=" + _ARCH + r"(?:," + _ARCH + r")*|"
    r"-gencode=arch=compute_\d{2,3}[af]?,code=" + _ARCH + r"|"
    r"-Xptxas=" + _PTXAS + r"(?:," + _PTXAS + r")*|--ptxas-options=" + _PTXAS + r"(?:," + _PTXAS + r")*|"
    r"--?Werror|-Wreorder|-Wno-[a-z-]+"
    r")$"
)
# NVRTC's own switches without an nvcc meaning (dropped when nvcc checks an NVRTC kernel).
_NVRTC_ONLY = re.compile(r"^(?:--?gpu-architecture=" + _ARCH + r"|-arch=" + _ARCH +
                         r"|--?dw|--?dlto|-ewp|--?device-as-default-execution-space|--?pch|-split-compile=\d+)$")
_CUDA_LIBS = ("cuda", "cudart", "cublas", "cublasLt", "cudnn", "curand", "cufft", "cusparse", "cusolver", "nvrtc",
              "nvToolsExt", "nvJitLink", "c10", "c10_cuda", "torch", "torch_cpu", "torch_cuda", "torch_python")
_LD = re.compile(r"^-l(?:" + "|".join(_CUDA_LIBS) + r")$")
# Flags written as two items (`-Xptxas -v`): read as one (`-Xptxas=-v`).
_PAIRED = ("-Xptxas", "--ptxas-options", "-Xcompiler", "--compiler-options", "-gencode", "--generate-code",
           "-maxrregcount", "--maxrregcount", "-arch", "--gpu-architecture", "-code", "-std", "--std", "-D", "-U",
           "-I", "--include-path", "-L", "-rdc", "-t", "--threads")


def _joined(flags: Sequence[str]) -> list[str]:
    out: list[str] = []
    items = [str(f) for f in flags if str(f).strip()]
    i = 0
    while i < len(items):
        f = items[i].strip()
        if f in _PAIRED and i + 1 < len(items):
            value = items[i + 1].strip()
            out.append(f"{f}{value}" if f in ("-D", "-U", "-I", "-L") else f"{f}={value}")
            i += 2
            continue
        out.append(f.replace("--generate-code=", "-gencode=").replace("--compiler-options=", "-Xcompiler="))
        i += 1
    return out


def _inside(path: str, roots: Iterable[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == os.path.realpath(r) or real.startswith(os.path.realpath(r).rstrip("/") + "/") for r in roots)


# Refused flags that make a compiler run a program, load code, or read or write a file the
# candidate names (or that name a path at all): asking for one is an attempt (`harness.sandbox.attempts`),
# where a flag merely missing from the allow-lists is a mistake.
_REACHING = re.compile(r"^(?:-wrapper|-include|--pre-include|-imacros|-iprefix|-iwithprefix|-isysroot|--sysroot|"
                       r"-fplugin|-B|--?specs|@|-ccbin|--compiler-bindir|-Xlinker|--linker-options|-Wl,|"
                       r"--options-file|-optf|-load|-T|-o|--output-file|-odir|--output-directory|--keep-dir|"
                       r"-save-temps|-fdump|-Xnvlink|-Xarchive)|[/\\]")


def flag_refusals(unit: SourceUnit, include_roots: Sequence[str]) -> list[str]:
    """Why this unit may not be compiled as asked (empty: its flags and include folders are allowed)."""
    return [message for message, _tried in refusals(unit, include_roots)]


def tried_outside(unit: SourceUnit, include_roots: Sequence[str]) -> list[str]:
    """What of the unit's refused flags, folders and includes would have reached outside its build
    (a program run, code loaded, a file named by path read or written): each is an attempt (the
    unit's name is not repeated in them)."""
    return [tried for _message, tried in refusals(unit, include_roots) if tried]


def refusals(unit: SourceUnit, include_roots: Sequence[str]) -> list[tuple[str, str]]:
    """Each refusal of the unit: (why it is refused, what it tried outside the build or "")."""
    out: list[tuple[str, str]] = []
    where = f"{unit.name}: "

    def reach(what: str, flag: str) -> str:
        return f"{what} {flag}" if _REACHING.search(flag) else ""

    for folder in unit.include_dirs:
        if not os.path.isabs(folder) or not _inside(folder, include_roots):
            out.append((f"{where}include folder {folder!r} is outside the toolchain's include folders; "
                        "candidates have no files of their own to include", f"include folder {folder}"))
    cuda_flags = _joined(unit.nvcc_options)
    for flag in cuda_flags:
        if flag.startswith(("-I", "--include-path=")):
            folder = flag.split("=", 1)[1] if flag.startswith("--include-path=") else flag[2:]
            if not _inside(folder, include_roots):
                out.append((f"{where}include folder {folder!r} is outside the toolchain's include folders",
                            f"include folder {folder}"))
            continue
        if flag.startswith("-Xcompiler="):
            bad = [h for h in flag.split("=", 1)[1].split(",") if h and not _HOST.match(h)]
            out += [(f"{where}host compiler flag {h!r} (through -Xcompiler) is not allowed",
                     reach("host compiler flag (through -Xcompiler)", h)) for h in bad]
            continue
        if unit.kind == "nvrtc" and _NVRTC_ONLY.match(flag):
            continue
        if not _NVCC.match(flag):
            out.append((f"{where}CUDA compiler flag {flag!r} is not allowed (allowed: optimisation, -D/-U, -std, "
                        "fast-math, maxrregcount, -Xptxas -v, arch/gencode, line info, warnings)",
                        reach("CUDA compiler flag", flag)))
    for flag in _joined(unit.cflags):
        if flag.startswith("-I"):
            if not _inside(flag[2:], include_roots):
                out.append((f"{where}include folder {flag[2:]!r} is outside the toolchain's include folders",
                            f"include folder {flag[2:]}"))
        elif not _HOST.match(flag):
            out.append((f"{where}host compiler flag {flag!r} is not allowed (allowed: -O, -std, -D/-U, -g, warnings, "
                        "-march=native, a few -f switches)", reach("host compiler flag", flag)))
    for flag in _joined(unit.ldflags):
        if flag.startswith("-L"):
            if not _inside(flag[2:], (*include_roots, *(os.path.dirname(r.rstrip("/")) for r in include_roots))):
                out.append((f"{where}library folder {flag[2:]!r} is outside the toolchain's folders",
                            f"library folder {flag[2:]}"))
        elif not _LD.match(flag):
            out.append((f"{where}linker flag {flag!r} is not allowed (allowed: -l of CUDA and torch libraries)",
                        reach("linker flag", flag)))
    out += include_refusals(unit)
    return out


# ---------------------------------------------------------------------------------------------
# #include lines

_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*(include_next|include|import|embed)\b[ \t]*(.*)$", re.M)
_HAS = re.compile(r"__has_(?:include_next|include|embed)\s*\(\s*([^)]*)\)")
_ASM_INCLUDE = re.compile(r"\.(?:incbin|include)\b")
_OPERAND = re.compile(r'^(?:"([^"\n]*)"|<([^>\n]*)>)')


def _preprocessed(text: str) -> str:
    """The text as the preprocessor reads directives: digraphs, line splices and comments resolved."""
    text = text.replace("%:", "#").replace("??=", "#")
    text = re.sub(r"\\[ \t]*\r?\n", "", text)
    return re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.S)


def _bad_name(name: str) -> str | None:
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return "an absolute path"
    if ".." in re.split(r"[\\/]", name):
        return "a path leaving the include folders (..)"
    return None


def include_refusals(unit: SourceUnit) -> list[tuple[str, str]]:
    """`#include` lines of the unit's sources that name a file by absolute path, climb out with
    `..`, or compute the name (a macro), and assembler `.incbin`/`.include`: (why refused, what it
    tried outside the build; "" for a malformed line, a mistake)."""
    out: list[tuple[str, str]] = []
    for label, text in (("cuda_sources", unit.cuda_source), ("cpp_sources", unit.cpp_source)):
        if not text:
            continue
        where = f"{unit.name} ({label}): "
        clean = _preprocessed(text)
        operands = [(m.group(1), m.group(2).strip()) for m in _DIRECTIVE.finditer(clean)]
        operands += [("__has_include", m.group(1).strip()) for m in _HAS.finditer(clean)]
        for what, operand in operands:
            m = _OPERAND.match(operand)
            if not m:
                computed = re.match(r"[A-Za-z_]", operand) is not None  # a macro names the file
                out.append((f"{where}#{what} {operand[:60]!r} is computed or malformed; "
                            'name headers literally, as "name.h" or <name.h>',
                            f"#{what} {operand[:80]} (computed, {label})" if computed else ""))
                continue
            why = _bad_name(m.group(1) if m.group(1) is not None else m.group(2))
            if why:
                out.append((f"{where}#{what} {operand[:80]} names {why}; candidates may include "
                            "only the toolchain's headers, by relative name", f"#{what} {operand[:120]} ({label})"))
        found = _ASM_INCLUDE.search(clean)
        if found:
            line = clean[clean.rfind("\n", 0, found.start()) + 1:].split("\n", 1)[0].strip()
            out.append((f"{where}assembler .incbin/.include reads files into the build; not allowed",
                        f"assembler {line[:120]} ({label})"))
    return out


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
        opts = [o for o in _joined(unit.nvcc_options) if not _NVRTC_ONLY.match(o)]
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
        cuda_flags = _joined(unit.nvcc_options)
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
        tc.cxx, "-fsyntax-only", *defines, *host_incs, "-fPIC", f"-std={tc.std}", *_joined(unit.cflags), "main.cpp")))
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
