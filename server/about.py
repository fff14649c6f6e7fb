"""Who this program is: its distribution name and installed version (cheap to import)."""

from __future__ import annotations

# `kb-mcp` on PyPI is an unrelated program; this distribution has its own name and keeps the command.
DIST_NAME = "kernel-kb-mcp"
COMMAND = "kb-mcp"


def installed_version(dist: str) -> str | None:
    """The installed version of distribution `dist`, read from its metadata (nothing imported), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def package_version() -> str:
    """The installed version ('' when running from an uninstalled tree)."""
    return installed_version(DIST_NAME) or ""
