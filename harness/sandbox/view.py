"""What a sandboxed process sees: its mount view (the system folders, the Python code, the toolchains,
all read-only) and the places no sandbox may see, even under a folder it is given. `harness.sandbox.sandbox`
builds bubblewrap's arguments from it."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kb_mcp.kb import paths

ENV_EXTRA_RO = "KB_MCP_SANDBOX_RO"  # extra folders the sandbox may read (os.pathsep-separated)


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _real(p: str | Path) -> Path:
    return Path(os.path.realpath(p))


@dataclass
class View:
    """The mount view of one sandboxed process (bubblewrap arguments are built from it)."""

    ro: list[Path] = field(default_factory=list)  # bound read-only at the same path
    rw: list[Path] = field(default_factory=list)  # bound writable at the same path
    devices: list[Path] = field(default_factory=list)
    symlinks: dict[str, str] = field(default_factory=dict)  # path -> target

    def add_ro(self, path: Path) -> None:
        """Adds a read-only path unless it or a folder above it is there already."""
        if path.exists() and not any(_under(path, r) for r in self.ro):
            self.ro = [r for r in self.ro if not _under(r, path)] + [path]


def _system_view() -> View:
    view = View()
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        p = Path(top)
        if p.is_symlink():
            view.symlinks[top] = os.readlink(top)
        elif p.is_dir():
            view.add_ro(p)
    view.add_ro(Path("/usr"))
    # What CUDA and NVML read of /sys (PCI topology, NUMA, driver parameters), not all of it.
    for part in ("devices", "bus", "class", "dev", "module", "kernel/mm"):
        view.add_ro(Path("/sys") / part)
    for name in ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "os-release",
                 "nsswitch.conf", "host.conf"):
        view.add_ro(Path("/etc") / name)
    return view


def _code_roots() -> list[Path]:
    """Folders the Python code lives in: the interpreter's prefixes, sys.path, kb_mcp's packages."""
    import importlib.util
    import site
    import sysconfig

    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable)}
    roots.update(sysconfig.get_paths().values())
    roots.update(site.getsitepackages())
    roots.update(p for p in sys.path if p and os.path.isdir(p))
    for name in ("kb_mcp.harness", "kb_mcp.kb"):
        spec = importlib.util.find_spec(name)
        roots.update(spec.submodule_search_locations or [] if spec else [])
    return [Path(os.path.abspath(r)) for r in roots if r and os.path.isdir(r)]


# Where Nsight Compute's launcher looks for its real install besides the toolkit's own folder.
NSIGHT_COMPUTE_HOMES = (Path("/opt/nvidia/nsight-compute"),)


def _linked_outside(root: Path) -> list[Path]:
    """Folders that entries directly inside `root` link to outside it: a toolkit's
    `nsight-compute-<version>` is often a link into `/opt/nvidia`, and ncu's launcher script
    fails ("Nsight Compute is not installed") when the link's target is not in the view."""
    found = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return []
    for entry in entries:
        if entry.is_symlink():
            target = _real(entry)
            if target.is_dir() and not target.is_relative_to(root):
                found.append(target)
    return found


def _tool_roots() -> list[Path]:
    """Install folders of the CUDA toolkit, ncu and the libraries on LD_LIBRARY_PATH."""
    roots: list[Path] = []
    for tool in ("nvcc", "ncu", os.environ.get("KB_MCP_NCU") or ""):
        found = shutil.which(tool) if tool else None
        if found:
            root = _real(found).parent.parent
            roots += [root, *_linked_outside(root)]
    roots += list(NSIGHT_COMPUTE_HOMES)
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            roots.append(Path(os.environ[var]))
    roots += [Path(p) for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p and os.path.isabs(p)]
    roots += [Path(p) for p in os.environ.get(ENV_EXTRA_RO, "").split(os.pathsep) if p and os.path.isabs(p)]
    return [r for r in roots if r.is_dir()]


def private_places(extra: Iterable[Path] = ()) -> list[Path]:
    """Places no sandbox may see, even under a folder it is given: the KB's home, the cache, the
    home folder and the server's working folder."""
    places = [paths.home_dir(), paths.cache_dir(), Path.home(), Path.cwd()]
    kb = paths.resolve_kb_path(None)
    places += [kb.parent, paths.artifacts_dir(kb)]
    places += list(extra)
    return [Path(os.path.abspath(p)) for p in places]

