"""Arch families from compute capabilities."""

from __future__ import annotations

import pytest

from kb_mcp.kb.arch import ArchError, arch_family, parse_compute_capability
from kb_mcp.kb.models import ALL_ARCH


@pytest.mark.parametrize(
    "arch, family",
    [("sm_90", "hopper"), ("9.0", "hopper"), ("sm_90a", "hopper"), ("compute_90", "hopper"), ("HOPPER", "hopper"),
     ("sm_80", "ampere"), ("8.6", "ampere"), ("sm_89", "ada"), ("7.5", "turing"), ("sm_70", "volta"),
     ("sm_100", "blackwell"), ("12.0", "blackwell"), ("sm_61", "pascal"), ("", ALL_ARCH), (None, ALL_ARCH),
     ("*", ALL_ARCH), ("sm_150", "sm_150")],
)
def test_arch_family(arch: str | None, family: str) -> None:
    assert arch_family(arch) == family


def test_parse_and_errors() -> None:
    assert parse_compute_capability("sm_100") == (10, 0)
    assert parse_compute_capability("9.0") == (9, 0)
    with pytest.raises(ArchError):
        arch_family("pentium")
