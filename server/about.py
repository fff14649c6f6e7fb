"""Who this program is: its distribution name and installed version (cheap to import)."""

from __future__ import annotations

# `kb-mcp` on PyPI is an unrelated program; this distribution has its own name and keeps the command.
DIST_NAME = "kernel-kb-mcp"
COMMAND = "kb-mcp"


def package_version() -> str:
    """The installed version ('' when running from an uninstalled tree)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DIST_NAME)
    except PackageNotFoundError:
        return ""
