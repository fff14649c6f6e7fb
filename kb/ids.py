"""Deterministic ids: the same fact gets the same id in every process and every KB file, which is
what makes recording idempotent and merging free of duplicates."""

from __future__ import annotations

import hashlib
import re

from kb_mcp.kb.models import Signature


def _digest(*parts: str, n: int = 16) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")  # ('ab', 'c') and ('a', 'bc') must differ
    return h.hexdigest()[:n]


def slug(text: str, max_len: int = 48) -> str:
    """Lower-case identifier from free text: 'Vectorize loads (float4)!' -> 'vectorize_loads_float4'."""
    s = re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")
    return s[:max_len].rstrip("_") or "unnamed"


def outcome_id(candidate_id: str, optimization_id: str) -> str:
    """The replay-buffer id of applying `optimization_id` that produced `candidate_id` (one per pair)."""
    return "out_" + _digest(candidate_id, optimization_id)


def lesson_id(state_id: str, optimization_id: str, text: str) -> str:
    """Same lesson text on the same (state, optimization) is one lesson, however often it is told."""
    return "l_" + _digest(state_id, optimization_id, " ".join(text.split()), n=12)


def transition_key(state_id: str, optimization_id: str, next_state_id: str) -> str:
    """Natural key of a Transition row."""
    return f"{state_id}|{optimization_id}|{next_state_id}"


def discovered_state_id(signature: Signature) -> str:
    """Id of the state discovered for a new signature key: every server that meets the same new
    (primary, secondary) pair names it alike, so merged KBs do not hold the same state twice."""
    secondary = signature.secondary.value if signature.secondary else "unspecified"
    return f"discovered_{signature.primary.value}_{secondary}"


def agent_optimization_id(name: str) -> str:
    """Id of an optimization an agent described by name."""
    return "agent_" + slug(name)
