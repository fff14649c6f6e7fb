"""Matching signatures to states, and discovering a state exactly once per new signature."""

from __future__ import annotations

import math
import threading
from pathlib import Path

from kb_mcp.kb.matching import (
    INHERIT_DISCOUNT,
    INHERIT_WEIGHT,
    discover_state,
    flatten_metrics,
    match_state,
    signature_from_metrics,
)
from kb_mcp.kb.models import ALL_ARCH, Primary, Score, Secondary, Signature
from kb_mcp.kb.store import KBStore


def test_exact_key_match(kb_path: Path) -> None:
    store = KBStore.open(kb_path)
    sig = signature_from_metrics(Primary.memory, Secondary.dram_bandwidth, {"dram_throughput_pct": 91.0,
                                                                            "sm_throughput_pct": 12.0})
    with store.read() as kb:
        m = match_state(kb, sig)
    assert m is not None and m.exact and m.state.id == "memory_bandwidth_saturated"
    assert m.distance == 0.0 and m.confidence == 1.0


def test_nearest_by_metric_ranges_when_key_is_new(kb_path: Path) -> None:
    store = KBStore.open(kb_path)
    # a latency-primary kernel whose metrics look like DRAM saturation: no seed state has this key
    metrics = {"dram_throughput_pct": 88.0, "sm_throughput_pct": 20.0, "warp_stalls": {"long_scoreboard": 1.0}}
    sig = signature_from_metrics(Primary.latency, Secondary.dram_bandwidth, metrics)
    with store.read() as kb:
        m = match_state(kb, sig)
    assert m is not None and not m.exact
    assert m.state.id == "memory_bandwidth_saturated"  # same secondary and metrics inside its ranges
    # with only metrics to go by, metrics decide among same-primary states
    sig2 = Signature(primary=Primary.compute, secondary=None)
    with store.read() as kb:
        m2 = match_state(kb, sig2, metrics={"xu_pipe_pct": 85.0, "tensor_pipe_pct": 1.0, "fma_pipe_pct": 20.0})
    assert m2 is not None and m2.state.id == "special_function_bound"


def test_flatten_metrics_handles_nested_and_missing_values() -> None:
    flat = flatten_metrics({"a_pct": 1, "b": None, "warp_stalls": {"barrier": 2.5, "x": float("nan")}, "name": "k",
                            "flag": True})
    assert flat == {"a_pct": 1.0, "warp_stalls.barrier": 2.5}


def test_discovered_state_inherits_discounted_scores_once(kb_path: Path) -> None:
    store = KBStore.open(kb_path)
    with store.transaction() as tx:  # give the parent a measured per-arch score
        tx.put_score(Score(state_id="memory_bandwidth_saturated", optimization_id="vectorize_global_access",
                           arch="hopper",
                           samples=4, attempts=4, mean_log_speedup=math.log(1.6), prior=False,
                           prior_mean_log_speedup=math.log(1.12), prior_weight=1.0))
    sig = signature_from_metrics(Primary.latency, Secondary.dram_bandwidth, {"dram_throughput_pct": 88.0,
                                                                             "sm_throughput_pct": 20.0})
    with store.transaction() as tx:
        state, created = discover_state(tx, sig)
    assert created and state.origin == "discovered" and state.parent_id == "memory_bandwidth_saturated"
    assert state.signature.key == "latency/dram_bandwidth"
    parent_opts = {s.optimization_id for s in store.candidates("memory_bandwidth_saturated")}
    assert {s.optimization_id for s in store.candidates(state.id)} == parent_opts
    child = store.get_score(state.id, "vectorize_global_access", "hopper")
    parent = store.get_score("memory_bandwidth_saturated", "vectorize_global_access", "hopper")
    assert child is not None and parent is not None and child.prior and child.samples == 0
    assert child.prior_mean_log_speedup == math.log(parent.expected_speedup) * INHERIT_DISCOUNT
    assert child.prior_weight == INHERIT_WEIGHT
    pooled_child = store.get_score(state.id, "flash_attention_tiling", ALL_ARCH)
    assert pooled_child is not None and pooled_child.prior_mean_log_speedup == math.log(2.0) * INHERIT_DISCOUNT
    # re-matching returns the discovered state; discovering again creates nothing
    with store.read() as kb:
        m = match_state(kb, sig)
    assert m is not None and m.exact and m.state.id == state.id
    with store.transaction() as tx:
        again, created_again = discover_state(tx, sig)
    assert again.id == state.id and not created_again
    assert store.stats().states == {"seed": 23, "discovered": 1}


def test_concurrent_discovery_creates_one_state(kb_path: Path) -> None:
    KBStore.open(kb_path)
    sig = Signature(primary=Primary.host, secondary=Secondary.divergence)
    results: list[bool] = []

    def discover() -> None:
        store = KBStore.open(kb_path)  # a store per thread: separate caches, shared file lock
        with store.transaction() as tx:
            results.append(discover_state(tx, sig)[1])

    threads = [threading.Thread(target=discover) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 5 + [True]
    assert KBStore.open(kb_path).stats().states["discovered"] == 1
