"""What a candidate may ask of the compilers: the allow-lists of its flags and include folders, and
the check of its `#include` lines (server side, pure).

A candidate chooses compiler flags (`extra_cflags`, `extra_cuda_cflags`, `extra_ldflags`, NVRTC
options) and include folders, and its sources contain `#include` lines. Passed verbatim these are a
way out of any check: `-wrapper /bin/sh,-c,...` runs a command during a compile, `-include FILE` or
`#include "/absolute/path"` puts a private file into the compile log, `-fplugin=` loads code into
the compiler. So flags come from allow-lists (`refusals` lists what is not on them, and what of it
would reach outside the build), include folders must lie inside the toolchain's own include
folders, and `#include` names must be plain relative names (no absolute path, no `..`, no
computed include). The sandbox the compilers run in (`harness.sandbox`) is the second wall; this
module is the first, with messages that say what to change. The compiler runs built from allowed
flags are `harness.builds.toolchain`'s.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence

from kb_mcp.harness.candidate import SourceUnit

__all__ = ["NVRTC_ONLY", "flag_refusals", "include_refusals", "joined_flags", "refusals", "tried_outside"]

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
NVRTC_ONLY = re.compile(r"^(?:--?gpu-architecture=" + _ARCH + r"|-arch=" + _ARCH +
                         r"|--?dw|--?dlto|-ewp|--?device-as-default-execution-space|--?pch|-split-compile=\d+)$")
_CUDA_LIBS = ("cuda", "cudart", "cublas", "cublasLt", "cudnn", "curand", "cufft", "cusparse", "cusolver", "nvrtc",
              "nvToolsExt", "nvJitLink", "c10", "c10_cuda", "torch", "torch_cpu", "torch_cuda", "torch_python")
_LD = re.compile(r"^-l(?:" + "|".join(_CUDA_LIBS) + r")$")
# Flags written as two items (`-Xptxas -v`): read as one (`-Xptxas=-v`).
_PAIRED = ("-Xptxas", "--ptxas-options", "-Xcompiler", "--compiler-options", "-gencode", "--generate-code",
           "-maxrregcount", "--maxrregcount", "-arch", "--gpu-architecture", "-code", "-std", "--std", "-D", "-U",
           "-I", "--include-path", "-L", "-rdc", "-t", "--threads")


def joined_flags(flags: Sequence[str]) -> list[str]:
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
    cuda_flags = joined_flags(unit.nvcc_options)
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
        if unit.kind == "nvrtc" and NVRTC_ONLY.match(flag):
            continue
        if not _NVCC.match(flag):
            out.append((f"{where}CUDA compiler flag {flag!r} is not allowed (allowed: optimisation, -D/-U, -std, "
                        "fast-math, maxrregcount, -Xptxas -v, arch/gencode, line info, warnings)",
                        reach("CUDA compiler flag", flag)))
    for flag in joined_flags(unit.cflags):
        if flag.startswith("-I"):
            if not _inside(flag[2:], include_roots):
                out.append((f"{where}include folder {flag[2:]!r} is outside the toolchain's include folders",
                            f"include folder {flag[2:]}"))
        elif not _HOST.match(flag):
            out.append((f"{where}host compiler flag {flag!r} is not allowed (allowed: -O, -std, -D/-U, -g, warnings, "
                        "-march=native, a few -f switches)", reach("host compiler flag", flag)))
    for flag in joined_flags(unit.ldflags):
        if flag.startswith("-L"):
            if not _inside(flag[2:], (*include_roots, *(os.path.dirname(r.rstrip("/")) for r in include_roots))):
                out.append((f"{where}library folder {flag[2:]!r} is outside the toolchain's folders",
                            f"library folder {flag[2:]}"))
        elif not _LD.match(flag):
            out.append((f"{where}linker flag {flag!r} is not allowed (allowed: -l of CUDA and torch libraries)",
                        reach("linker flag", flag)))
    out += include_refusals(unit)
    return out


# #include lines

_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*(include_next|include|import|embed)\b[ \t]*(.*)$", re.M)
_HAS = re.compile(r"__has_(?:include_next|include|embed)\s*\(\s*([^)]*)\)")
_ASM_INCLUDE = re.compile(r"\.(?:incbin|include)\b")
# `#pragma GCC dependency "file"` opens a file found as an #include's would be (to compare its date)
_PRAGMA = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+(.*)$", re.M)
_PRAGMA_OPERATOR = re.compile(r'_Pragma\s*\(\s*"((?:[^"\\\n]|\\.)*)"\s*\)')
_DEPENDENCY = re.compile(r"^(?:GCC[ \t]+)?dependency\b[ \t]*(.*)$")
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


def _dependencies(clean: str) -> list[str]:
    """The operands of `#pragma GCC dependency` lines and of `_Pragma("GCC dependency ...")`
    operators (its string destringized as the preprocessor does)."""
    pragmas = [m.group(1) for m in _PRAGMA.finditer(clean)]
    pragmas += [re.sub(r'\\(["\\])', r"\1", m.group(1)) for m in _PRAGMA_OPERATOR.finditer(clean)]
    return [m.group(1).strip() for text in pragmas if (m := _DEPENDENCY.match(text.strip()))]


def include_refusals(unit: SourceUnit) -> list[tuple[str, str]]:
    """`#include` lines (and the other ways of naming a file the compiler opens: `__has_include`,
    `#embed`, `#pragma GCC dependency`) of the unit's sources that name a file by absolute path,
    climb out with `..`, or compute the name (a macro), and assembler `.incbin`/`.include`: (why
    refused, what it tried outside the build; "" for a malformed line, a mistake)."""
    out: list[tuple[str, str]] = []
    for label, text in (("cuda_sources", unit.cuda_source), ("cpp_sources", unit.cpp_source)):
        if not text:
            continue
        where = f"{unit.name} ({label}): "
        clean = _preprocessed(text)
        operands = [(m.group(1), m.group(2).strip()) for m in _DIRECTIVE.finditer(clean)]
        operands += [("__has_include", m.group(1).strip()) for m in _HAS.finditer(clean)]
        operands += [("pragma GCC dependency", operand) for operand in _dependencies(clean)]
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
