"""The build process (worker side): `python -m kb_mcp.harness.worker.build SPEC.json`, or `--probe`.

Started by the build service (`harness.builds.builds`) inside a sandbox of its own for one `load_inline`
unit whose flags and includes the server has already checked (`allow_lists.flag_refusals`). It
compiles and links the extension exactly as `torch.utils.cpp_extension.load` would (torch's own
ninja build), but never imports it: no code of the candidate runs here, C++ static constructors
included, so what it leaves in its scratch folder is the compilers' work alone. The server then
publishes the `.so` read-only in the shared cache. The report (`protocol.BuildReport`) goes to the
path the spec names.

`--probe` prints the toolchain as the sandbox sees it (`toolchain.ToolchainInfo`: torch's include
folders, C++ standard, nvcc flags and ABI, the compilers' paths), which the compile-only path uses
to build its compiler command lines.
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from kb_mcp.harness.builds.toolchain import (
    TORCH_CUDA_BUILD_ONLY,
    ToolchainInfo,
    cuda_arch_list,
    extension_name,
    inline_sources,
    light_variants,
    missing_declarations,
    truncate,
)
from kb_mcp.harness.candidate import SourceUnit
from kb_mcp.harness.protocol import BuildReport, BuildSpec


def build_unit(unit: SourceUnit, arch: str, out_dir: Path) -> BuildReport:
    """Builds `unit` under `out_dir/<ext>/` (light headers first where they may do); never imports it."""
    import torch
    from torch.utils import cpp_extension

    os.environ["TORCH_CUDA_ARCH_LIST"] = cuda_arch_list(arch)
    build = cpp_extension._write_ninja_file_and_build_library
    accepted = set(inspect.signature(build).parameters)
    t0 = time.perf_counter()
    variants = light_variants(unit)
    first_log = ""
    for light in variants:
        ext = extension_name(unit, light, torch.__version__, arch)
        folder = out_dir / ext
        folder.mkdir(parents=True, exist_ok=True)
        main_cpp, cuda_cu = inline_sources(unit, light)
        sources = [folder / "main.cpp"]
        sources[0].write_text(main_cpp)
        if cuda_cu:
            sources.append(folder / "cuda.cu")
            sources[1].write_text(cuda_cu)
        args: dict[str, Any] = dict(name=ext, sources=[str(s) for s in sources], extra_cflags=unit.cflags or None,
                    extra_cuda_cflags=unit.nvcc_options or None, extra_sycl_cflags=None,
                    extra_ldflags=unit.ldflags or None, extra_include_paths=unit.include_dirs or None,
                    build_directory=str(folder), verbose=False,
                    with_cuda=unit.with_cuda if unit.with_cuda is not None else bool(cuda_cu), with_sycl=False)
        try:
            build(**{k: v for k, v in args.items() if k in accepted})
        except Exception as exc:  # noqa: BLE001 - the compilers' errors, as torch reports them
            log = truncate(str(exc).replace(str(folder) + "/", ""))
            if light and len(variants) > 1 and missing_declarations(log):
                first_log = log
                continue
            return BuildReport(ok=False, ext=ext, light=light, log=log, seconds=round(time.perf_counter() - t0, 3))
        so = folder / f"{ext}.so"
        if not so.is_file():
            return BuildReport(ok=False, ext=ext, light=light, log="the build left no library",
                               seconds=round(time.perf_counter() - t0, 3))
        note = "" if light or not first_log else "(rebuilt with torch/types.h after a light-header build failed)"
        return BuildReport(ok=True, ext=ext, light=light, so_path=str(so), log=note,
                           seconds=round(time.perf_counter() - t0, 3))
    raise AssertionError("unreachable")  # pragma: no cover


def probe() -> ToolchainInfo:
    """The toolchain as seen from inside the sandbox."""
    import torch
    from torch.utils import cpp_extension

    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    includes = list(cpp_extension.include_paths()) + [sysconfig.get_paths()["include"]]
    nvcc = shutil.which("nvcc")
    version = ""
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or getattr(cpp_extension, "CUDA_HOME", None)
    if nvcc:
        try:
            out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
            version = out.strip().splitlines()[-1] if out.strip() else "unknown"
        except (OSError, subprocess.TimeoutExpired):
            version = "unknown"
    roots = includes + ["/usr/include", "/usr/local/include", "/usr/local/cuda/include"]
    if cuda_home:
        roots.append(os.path.join(cuda_home, "include"))
    roots += [str(p) for p in Path("/usr/local").glob("cuda*/include")]
    roots += [str(p) for p in Path("/usr/local").glob("cuda*/targets/*/include")]
    # The toolkit's include folder, as load_inline gives it to the host compiler of a CUDA extension.
    homes = [os.path.join(cuda_home, "include")] if cuda_home else []
    homes += ["/usr/local/cuda/include", *sorted(str(p) for p in Path("/usr/local").glob("cuda*/include"))]
    cuda_includes = [h for h in homes if os.path.isfile(os.path.join(h, "cuda_runtime_api.h"))][:1]
    torch_cuda_headers = any(os.path.isfile(os.path.join(inc, *name.split("/"))) for inc in includes
                             for name in TORCH_CUDA_BUILD_ONLY)
    return ToolchainInfo(
        torch_version=torch.__version__, includes=includes, std="c++20" if (major, minor) >= (2, 12) else "c++17",
        nvcc_common=list(cpp_extension.COMMON_NVCC_FLAGS), abi=int(bool(torch._C._GLIBCXX_USE_CXX11_ABI)),
        nvcc=nvcc, cxx=shutil.which("c++") or shutil.which("g++") or "c++", nvcc_version=version,
        include_roots=sorted({os.path.realpath(r) for r in roots if os.path.isdir(r)}),
        cuobjdump=find_cuda_tool("cuobjdump", cuda_home), nvdisasm=find_cuda_tool("nvdisasm", cuda_home),
        cuda_includes=cuda_includes, torch_cuda_headers=torch_cuda_headers,
    )


def find_cuda_tool(name: str, cuda_home: str | None) -> str | None:
    """A CUDA binary utility (`cuobjdump`, and the `nvdisasm` it runs to print SASS; used by
    `harness.judgment.precision`): on PATH, in the CUDA toolkit, else from NVIDIA's wheels of it
    (`nvidia-cuda-cuobjdump`, `nvidia-cuda-nvdisasm`)."""
    found = shutil.which(name)
    homes = ([cuda_home] if cuda_home else []) + [str(p) for p in sorted(Path("/usr/local").glob("cuda*"))]
    for home in homes:
        if not found and os.access(os.path.join(home, "bin", name), os.X_OK):
            found = os.path.join(home, "bin", name)
    if found:
        return found
    try:
        import nvidia  # the namespace package NVIDIA's CUDA wheels install into
    except ImportError:
        return None
    for base in nvidia.__path__:
        for cand in sorted(Path(base).glob(f"cu*/bin/{name}")):
            if os.access(cand, os.X_OK):
                return str(cand)
    return None


def main(argv: list[str] | None = None) -> int:
    """Builds the spec's unit (writing its BuildReport), or prints the toolchain (--probe)."""
    parser = argparse.ArgumentParser(prog="python -m kb_mcp.harness.worker.build")
    parser.add_argument("spec", nargs="?", help="the BuildSpec JSON file")
    parser.add_argument("--probe", action="store_true", help="print the toolchain as JSON and exit")
    args = parser.parse_args(argv)
    if args.probe:
        print(probe().model_dump_json())
        return 0
    spec = BuildSpec.model_validate_json(Path(args.spec).read_text())
    report = build_unit(spec.unit, spec.arch, Path(spec.out_dir))
    Path(spec.report_path).write_text(report.model_dump_json())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
