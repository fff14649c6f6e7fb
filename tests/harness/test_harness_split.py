"""The trust boundary in the code: the server side of `harness/` never imports torch or anything of
the worker side (`harness/worker/`, the code that runs inside the sandbox), and the two speak only
through `harness.protocol`."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "harness"
# the server side: every module of harness/ but its worker side, and the profiling package beside it
SERVER_SIDE = sorted(p for p in [*HARNESS.rglob("*.py"), *(ROOT / "profiling").rglob("*.py")]
                     if p.name != "__init__.py" and "worker" not in p.relative_to(HARNESS.parent).parts)
WORKER_SIDE = sorted(p for p in (HARNESS / "worker").glob("*.py") if p.name != "__init__.py")


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module a file imports, at any depth (function-level imports included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


@pytest.mark.parametrize("path", SERVER_SIDE, ids=lambda p: p.name)
def test_the_server_side_imports_neither_torch_nor_the_worker_side(path: Path) -> None:
    bad = [(line, name) for line, name in _imports(path)
           if name == "torch" or name.startswith(("torch.", "kb_mcp.harness.worker", "numpy"))]
    assert bad == [], f"{path.name} imports worker-side code: {bad}"


def test_the_worker_side_reaches_the_server_side_only_through_pure_modules() -> None:
    """What runs in the sandbox may use the shared vocabulary (protocol, problem, verdict, toolchain,
    ...), never what starts processes or writes shared state (pool, builds, compile-only, profiler, the
    GPU lane)."""
    spawning = {"kb_mcp.harness.pool", "kb_mcp.harness.builds.builds", "kb_mcp.harness.builds.compile_only",
                "kb_mcp.harness.builds.ahead", "kb_mcp.profiling", "kb_mcp.harness.gpu.lane",
                "kb_mcp.harness.gpu.lane_file", "kb_mcp.kb.store"}
    bad = [(p.name, line, name) for p in WORKER_SIDE for line, name in _imports(p)
           if any(name == s or name.startswith(s + ".") for s in spawning)]
    assert bad == []


def test_importing_the_whole_server_side_loads_no_torch() -> None:
    modules = [p.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".") for p in SERVER_SIDE]
    names = [f"kb_mcp.{m}" for m in modules] + ["kb_mcp.tools.compile_and_verify",
                                                               "kb_mcp.tools.profile_kernel", "kb_mcp.tools.context"]
    code = (
        "import sys\n"
        + "".join(f"import {n}\n" for n in names)
        + "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'kb_mcp.harness.worker')))\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
