"""The shipped seed KB: every state of the architecture table with a real signature over canonical
metric names, 60+ specific optimizations linked to states, priors marked as priors."""

from __future__ import annotations

import re
from pathlib import Path

from kb_mcp.harness.profile_model import KernelMetrics
from kb_mcp.kb.models import ALL_ARCH, SECONDARY_OF
from kb_mcp.kb.seed import (
    SEED_LESSON_CHARS,
    SEED_PRIOR_WEIGHT,
    seed_lessons,
    seed_optimizations,
    seed_scores,
    seed_states,
)
from kb_mcp.kb.store import KBStore

ARCH_DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _table_rows() -> dict[str, str]:
    rows = re.findall(r"^\| (\w+) \| (\w+) / (\w+) \|$", ARCH_DOC.read_text(), flags=re.M)
    return {state: f"{p}/{s}" for state, p, s in rows if state != "state"}


def test_every_state_of_the_architecture_table_is_seeded_with_its_signature() -> None:
    table = _table_rows()
    assert len(table) == 23
    states = {s.id: s for s in seed_states()}
    assert set(table) <= set(states)
    for sid, key in table.items():
        assert states[sid].signature.key == key, sid


def test_signatures_use_canonical_metric_names_and_sane_ranges() -> None:
    fields = KernelMetrics.model_fields
    for state in seed_states():
        sig = state.signature
        assert sig.secondary is not None and SECONDARY_OF[sig.secondary] == sig.primary, state.id
        assert len(state.description) > 200, state.id
        for r in sig.ranges:
            base, _, sub = r.metric.partition(".")
            assert base in fields, f"{state.id}: {r.metric} is not a KernelMetrics field"
            assert (sub != "") == (base == "warp_stalls"), r.metric
            assert r.min is not None or r.max is not None
            if r.min is not None and r.max is not None:
                assert r.min <= r.max


def test_optimizations_are_specific_and_linked() -> None:
    opts = seed_optimizations()
    assert len(opts) >= 60
    state_ids = {s.id for s in seed_states()}
    per_state: dict[str, int] = dict.fromkeys(state_ids, 0)
    for o in opts:
        assert o.origin == "seed" and o.category and o.applicable_states
        assert len(o.description) >= 150, o.id
        assert len(o.when_helps) >= 40 and o.cost, o.id
        assert len(set(o.applicable_states)) == len(o.applicable_states)
        for s in o.applicable_states:
            per_state[s] += 1
    assert min(per_state.values()) >= 5, per_state
    names = [o.name for o in opts]
    assert len(set(names)) == len(names)


def test_seed_scores_are_small_weight_priors(kb_path: Path) -> None:
    scores = seed_scores()
    assert all(s.prior and s.samples == 0 and s.prior_weight == SEED_PRIOR_WEIGHT for s in scores)
    assert len({(s.state_id, s.optimization_id) for s in scores}) == len(scores)
    store = KBStore.open(kb_path)
    for s in scores[:20]:
        got = store.get_score(s.state_id, s.optimization_id, ALL_ARCH)
        assert got is not None and got.prior and got.prior_mean_log_speedup == s.prior_mean_log_speedup


def test_seed_lessons_are_short_trusted_and_about_an_optimization_where_it_applies(kb_path: Path) -> None:
    lessons = seed_lessons()
    assert lessons and all(x.source == "seed" and 0 < len(x.text) <= SEED_LESSON_CHARS for x in lessons)
    opts = {o.id: o for o in seed_optimizations()}
    assert all(x.state_id in opts[x.optimization_id].applicable_states for x in lessons)
    assert len({x.id for x in lessons}) == len(lessons)
    store = KBStore.open(kb_path)
    for x in lessons:
        assert x.id in {stored.id for stored in store.lessons(x.state_id, x.optimization_id)}


def test_the_seed_knows_compensated_fp32_on_tensor_cores() -> None:
    [opt] = [o for o in seed_optimizations() if o.id == "compensated_fp32_tensor_cores"]
    assert "tensor_cores_idle" in opt.applicable_states and opt.category == "tensor_core"
    for words in ("3xTF32", "cvt.rna.tf32.f32", "lo = tf32(x - hi)", "small terms first", "wgmma", "BF16x9",
                  "afresh", "precision probes"):
        assert words in opt.description, words
    texts = " ".join(x.text for x in seed_lessons() if x.optimization_id == opt.id)
    assert "hi = tf32(x)" in texts and "lo*hi' + hi*lo' + hi*hi'" in texts and "fresh accumulator" in texts
