"""GPU architecture families: scores are kept per family, because what pays off on a Hopper
(TMA, wgmma, 228 KB of shared memory per SM) differs from what pays off on an Ampere or a Volta."""

from __future__ import annotations

import re

from kb_mcp.kb.models import ALL_ARCH

# Compute capability (major, minor) -> family. Sources: NVIDIA CUDA C++ Programming Guide,
# "Compute Capabilities" table (sm_89 is Ada, sm_90 Hopper, sm_100/103/110/120/121 Blackwell).
_FAMILIES: dict[tuple[int, int], str] = {
    (6, 0): "pascal",
    (6, 1): "pascal",
    (6, 2): "pascal",
    (7, 0): "volta",
    (7, 2): "volta",
    (7, 5): "turing",
    (8, 0): "ampere",
    (8, 6): "ampere",
    (8, 7): "ampere",
    (8, 9): "ada",
    (9, 0): "hopper",
}
_MAJOR_FAMILIES: dict[int, str] = {6: "pascal", 7: "volta", 8: "ampere", 9: "hopper", 10: "blackwell", 11: "blackwell",
                                   12: "blackwell"}
KNOWN_FAMILIES = frozenset(_FAMILIES.values()) | frozenset(_MAJOR_FAMILIES.values())

_CC = re.compile(r"^(?:sm_?|compute_?)?(\d+)(?:\.(\d+))?([af])?$")


class ArchError(ValueError):
    """An arch string that names neither a compute capability nor a known family."""


def parse_compute_capability(text: str) -> tuple[int, int]:
    """Parses 'sm_90', 'sm90a', 'compute_90', '9.0' or '90' into (major, minor)."""
    m = _CC.match(text.strip().lower())
    if not m:
        raise ArchError(f"not a compute capability: {text!r} (expected e.g. 'sm_90' or '9.0')")
    digits, minor = m.group(1), m.group(2)
    if minor is not None:
        return int(digits), int(minor)
    if len(digits) < 2:
        return int(digits), 0
    # 'sm_90' -> (9, 0); 'sm_100' -> (10, 0); 'sm_120' -> (12, 0)
    return int(digits[:-1]), int(digits[-1])


def arch_family(arch: str | None) -> str:
    """The family that scores are kept under: 'sm_90' / '9.0' / 'hopper' -> 'hopper'.

    '' or None (no GPU verified the candidate) and '*' give ALL_ARCH. Raises ArchError on text that
    is neither a compute capability nor a known family name.
    """
    if arch is None or not arch.strip() or arch.strip() == ALL_ARCH:
        return ALL_ARCH
    text = arch.strip().lower()
    if text in KNOWN_FAMILIES:
        return text
    major, minor = parse_compute_capability(text)
    family = _FAMILIES.get((major, minor)) or _MAJOR_FAMILIES.get(major)
    if family is None:
        # An architecture newer than this table: keep its scores apart rather than pooling them
        # with an older family's.
        return f"sm_{major}{minor}"
    return family
