"""Helpers of the harness tests: fixture files, and candidate sources with injected faults."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def fixture_source(name: str) -> str:
    """The text of tests/harness/fixtures/<name>."""
    return (FIXTURES / name).read_text()


def with_fault(where: str, code: str, base: str = "relu_nvrtc.py") -> str:
    """An honest candidate with `code` run at module import, in __init__, or in forward."""
    src = fixture_source(base)
    lines = [f"        {line}" for line in code.strip().splitlines()]
    if where == "import":
        return src.replace("\n\nclass ModelNew", "\n" + "\n".join(line[8:] for line in lines) + "\n\n\nclass ModelNew",
                           1)
    if where == "init":
        return src.replace("        super().__init__()\n", "        super().__init__()\n" + "\n".join(lines) + "\n", 1)
    if where == "forward":
        return src.replace("        y = torch.empty_like(x)\n",
                           "\n".join(lines) + "\n        y = torch.empty_like(x)\n", 1)
    raise ValueError(where)
