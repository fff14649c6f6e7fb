"""The package installs every folder under the kb_mcp namespace, with no stray top-level modules."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("server", "tools", "kb", "harness", "profiling", "decomposition", "policy", "campaign", "clients")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_folder_is_listed() -> None:
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    on_disk = {
        "kb_mcp." + ".".join(init.parent.relative_to(ROOT).parts)
        for folder in FOLDERS
        for init in (ROOT / folder).rglob("__init__.py")
    }
    assert on_disk - listed == set(), f"add these to [tool.setuptools] packages: {sorted(on_disk - listed)}"


def test_every_top_level_package_is_mapped() -> None:
    """A new top-level folder with an `__init__.py` must be both mapped and checked here."""
    on_disk = {init.parent.name for init in ROOT.glob("*/__init__.py")}
    mapped = {key.removeprefix("kb_mcp.") for key in _pyproject()["tool"]["setuptools"]["package-dir"]}
    assert on_disk == mapped == set(FOLDERS), (sorted(on_disk), sorted(mapped), FOLDERS)


def test_folders_import_under_namespace_only() -> None:
    for folder in FOLDERS:
        mod = importlib.import_module(f"kb_mcp.{folder}")
        assert Path(mod.__file__).resolve().parent == ROOT / folder
    mapping = _pyproject()["tool"]["setuptools"]["package-dir"]
    assert all(key.startswith("kb_mcp.") for key in mapping), mapping


def test_console_script_points_at_cli() -> None:
    assert _pyproject()["project"]["scripts"]["kb-mcp"] == "kb_mcp.server.cli:main"
