"""The credit of one outcome (`policy.credit`): an honest lineage that starts slower than the reference is
credited with its own improvement, a deliberately slow start buys little, and the rule before this one
(every parent slower than the reference counted as the reference) is kept for comparison."""

from __future__ import annotations

import math

import pytest

from kb_mcp.policy.credit import (
    EAGER_CAP,
    MIN_WEIGHT,
    PEER_ALLOWANCE,
    SHIPPED,
    START_ALLOWANCE,
    CreditRule,
    Lineage,
    credit,
    start_weight,
)


def _root(slowness: float, *, eager: float = 1.0, peers: tuple[float, ...] = ()) -> Lineage:
    """A parent that is its lineage's root: the problem's first kernel, `slowness` times the reference."""
    ms = slowness * eager
    return Lineage(parent_ms=ms, best_ms=ms, root_ms=ms, root_eager_ms=eager, peers=peers)


def test_an_honest_slow_start_is_credited_with_its_own_improvement() -> None:
    # a first kernel 3x slower than eager, taken to 1.5x slower: a real 2x gain
    found = credit(3.0, 2.0, _root(3.0, eager=2.0))
    assert found is not None and found.speedup == pytest.approx(2.0) and found.basis == "parent"
    assert found.weight == 1.0
    # what rests on no choice of the caller: the candidate against the reference beside it
    assert found.trusted == pytest.approx(2.0 / 3.0)
    # the rule before credited the same step as a loss (0.67x): the cause of the issue this rule fixes
    before = credit(3.0, 2.0, _root(3.0, eager=2.0), EAGER_CAP)
    assert before is not None and before.speedup == pytest.approx(2.0 / 3.0) and before.basis == "parent_capped"
    assert before.trusted is None


def test_a_parent_no_slower_than_the_reference_is_the_basis_in_full() -> None:
    found = credit(0.5, 2.0, _root(0.75, eager=2.0))
    assert found is not None and (found.speedup, found.basis, found.weight, found.trusted) == (3.0, "parent", 1.0,
                                                                                                None)
    assert credit(0.5, 2.0, None) == credit(0.5, 2.0, None, EAGER_CAP)
    eager = credit(0.5, 2.0, None)
    assert eager is not None and (eager.speedup, eager.basis) == (4.0, "eager")
    assert credit(0.5, None, None) is None  # nothing to measure against


def test_a_root_far_slower_than_the_reference_weighs_less_however_large_its_gain() -> None:
    inside = credit(1.0, 1.0, _root(START_ALLOWANCE))
    assert inside is not None and inside.weight == 1.0
    sandbag = credit(1.0, 1.0, _root(100.0))  # 100x slow on purpose, then an ordinary candidate
    assert sandbag is not None and sandbag.speedup == pytest.approx(100.0)
    assert sandbag.weight == pytest.approx(START_ALLOWANCE / 100.0) and "100x slower" in sandbag.why
    assert sandbag.trusted == pytest.approx(1.0)
    assert start_weight(_root(1e6))[0] == MIN_WEIGHT
    # the allowance is the rule's: a stricter one weighs the same root less
    strict = credit(1.0, 1.0, _root(8.0), CreditRule(start_allowance=2.0))
    assert strict is not None and strict.weight == pytest.approx(0.25)


def test_a_root_far_slower_than_other_clients_first_kernels_weighs_less() -> None:
    # others started this problem at 1.2-2x; a root 8x slower than the reference is within the eager
    # allowance but more than PEER_ALLOWANCE times their median (1.5x)
    found = credit(1.0, 1.0, _root(8.0, peers=(1.2, 1.5, 2.0)))
    assert found is not None and found.weight == pytest.approx(PEER_ALLOWANCE * 1.5 / 8.0)
    assert "other clients" in found.why
    # first kernels faster than the reference count as the reference: a 3x root is not "far slower"
    near = credit(1.0, 1.0, _root(3.0, peers=(0.5, 0.6)))
    assert near is not None and near.weight == 1.0
    # without peers, the eager allowance alone
    alone = credit(1.0, 1.0, _root(8.0))
    assert alone is not None and alone.weight == 1.0


def test_a_lineage_counts_from_its_best_recorded_kernel_never_from_a_slowdown_it_recorded() -> None:
    # root 3x slower, then 2x slower (an improvement), then an agent kept a regression at 6x
    regressed = Lineage(parent_ms=12.0, best_ms=4.0, root_ms=6.0, root_eager_ms=2.0)
    found = credit(2.0, 2.0, regressed)
    assert found is not None and found.basis == "lineage_best" and found.speedup == pytest.approx(2.0)
    assert "slower than a kernel before it" in found.why
    # a lineage that was faster than the reference before (or started from it) counts from the reference
    was_fast = Lineage(parent_ms=12.0, best_ms=1.0, root_ms=6.0, root_eager_ms=2.0)
    capped = credit(2.0, 2.0, was_fast)
    assert capped is not None and capped.basis == "parent_capped" and capped.speedup == pytest.approx(1.0)
    assert capped.trusted is None


def test_the_root_slowness_is_the_roots_own_against_its_reference() -> None:
    assert _root(3.0, eager=5.0).root_slowness == pytest.approx(3.0)
    assert Lineage(parent_ms=1.0, best_ms=1.0, root_ms=1.0, root_eager_ms=0.0).root_slowness == 1.0
    assert math.isclose(credit(1.0, 1.0, _root(3.0), SHIPPED).speedup, 3.0)  # type: ignore[union-attr]
