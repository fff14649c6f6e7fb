"""Kernels and whole profiles: the best-supported cause per kernel, identical launches folded
together, and the candidate as a whole (launch overhead, redundant passes, or the time-weighted
majority of its kernels)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable

from kb_mcp.harness.profile_model import KernelMetrics, KernelProfile, Profile
from kb_mcp.kb import matching
from kb_mcp.kb.models import Primary, Secondary
from kb_mcp.policy.classify.detectors import DETECTORS
from kb_mcp.policy.classify.models import Diagnosis, Evidence, KernelClassification, ProfileClassification
from kb_mcp.policy.classify.signals import has_counters, missing_headline, v
from kb_mcp.policy.classify.thresholds import (
    HEAVY_SHARE,
    MANY_LAUNCHES,
    REDUNDANT_KERNELS,
    REDUNDANT_SHARE,
    TINY_KERNEL_US,
)
from kb_mcp.policy.classify.throughput import throughput_diagnosis

WHOLE = "(whole candidate)"


def _confidence(best: Diagnosis, runner_up: Diagnosis | None) -> float:
    support = max((r.estimated_speedup_pct or 0.0 for r in best.rules), default=0.0)
    conf = 0.5 + 0.35 * best.strength + 0.15 * min(support / 50.0, 1.0)
    if not best.specific:
        conf -= 0.1  # a throughput class says where, not why
    if runner_up is not None and best.score - runner_up.score < 0.15:
        conf *= 0.85  # a close second cause
    return round(max(0.05, min(conf, 0.97)), 3)


def _match_metrics(m: KernelMetrics) -> dict[str, float]:
    data = m.model_dump(exclude={"extra", "occupancy_limiter"}, exclude_none=True)
    return dict(matching.flatten_metrics(data))


def classify_kernel(k: KernelProfile) -> KernelClassification:
    """The signature of one kernel instance with its evidence (primary None if nothing can be said)."""
    found = [d for d in (det(k) for det in DETECTORS) if d is not None]
    fallback = throughput_diagnosis(k)
    ranked = sorted(found, key=lambda d: -d.score) or ([fallback] if fallback else [])
    base = KernelClassification(index=k.index, name=k.name, duration_ns=v(k.metrics.duration_ns),
                                metrics=_match_metrics(k.metrics), missing=missing_headline(k.metrics))
    if not ranked:
        base.note = ("no hardware counters for this kernel (timings only): its bottleneck cannot be named"
                     if not has_counters(k.metrics) else "no cause could be established from the metrics")
        return base
    best = ranked[0]
    runner = ranked[1] if len(ranked) > 1 else None
    others = [f"{d.key} ({d.score:.2f})" for d in ranked[1:]]
    if fallback is not None and found:
        others.append(f"{fallback.key} (throughput class)")
    base.primary, base.secondary = best.primary, best.secondary
    base.confidence = _confidence(best, runner)
    base.evidence = best.evidence
    base.rules = best.rules
    base.alternatives = others[:3]
    return base


def _group_key(k: KernelProfile) -> tuple[str, tuple[int, int, int], tuple[int, int, int]]:
    return k.full_name, k.grid, k.block


def _heavy_entries(kernels: list[KernelProfile], per_instance: dict[int, KernelClassification], total: float,
                   max_kernels: int) -> list[KernelClassification]:
    """Identical launches folded into one entry each, heaviest first, until HEAVY_SHARE of the time."""
    groups: dict[tuple[str, tuple[int, int, int], tuple[int, int, int]], list[KernelProfile]] = defaultdict(list)
    for k in kernels:
        groups[_group_key(k)].append(k)
    entries = []
    for members in groups.values():
        heaviest = max(members, key=lambda k: v(k.metrics.duration_ns))
        entry = per_instance[heaviest.index].model_copy()
        entry.instances = len(members)
        entry.duration_ns = sum(v(k.metrics.duration_ns) for k in members)
        entry.time_share = round(entry.duration_ns / total, 4)
        entries.append(entry)
    entries.sort(key=lambda e: -e.duration_ns)
    heavy: list[KernelClassification] = []
    covered = 0.0
    for entry in entries:
        if heavy and (covered >= HEAVY_SHARE or len(heavy) >= max_kernels):
            break
        heavy.append(entry)
        covered += entry.time_share
    return heavy


def classify_profile(profile: Profile, max_kernels: int = 5) -> ProfileClassification:
    """Heavy kernels (identical launches folded together, heaviest first) and the whole candidate."""
    kernels = profile.kernels
    total = sum(v(k.metrics.duration_ns) for k in kernels) or 1.0
    per_instance = {k.index: classify_kernel(k) for k in kernels}
    heavy = _heavy_entries(kernels, per_instance, total, max_kernels)
    overall, basis = _overall(kernels, per_instance, total)
    return ProfileClassification(kernels=heavy, overall=overall, basis=basis,
                                 counters_available=profile.counters_available)


def _overall(kernels: list[KernelProfile], per: dict[int, KernelClassification],
             total: float) -> tuple[KernelClassification | None, str]:
    if not kernels:
        return None, "no kernels ran in the profiled forward"
    found = _launch_overhead(kernels, total) or _redundant_passes(kernels, per, total)
    if found is not None:
        return found
    return _time_weighted(kernels, per, total)


def _launch_overhead(kernels: list[KernelProfile], total: float) -> tuple[KernelClassification, str] | None:
    """Many launches of tiny kernels: each costs about what launching it costs the host."""
    durations = [v(k.metrics.duration_ns) for k in kernels]
    n = len(kernels)
    median_us = statistics.median(durations) / 1e3
    if n < MANY_LAUNCHES or median_us >= TINY_KERNEL_US:
        return None
    conf = round(min(0.95, 0.6 + 0.05 * n + 0.2 * (1 - median_us / TINY_KERNEL_US)), 3)
    return KernelClassification(
        index=-1, name=WHOLE, instances=n, duration_ns=total, time_share=1.0,
        primary=Primary.launch_overhead, secondary=Secondary.many_small_launches, confidence=conf,
        evidence=[Evidence(metric="kernel_launches", value=n, threshold=MANY_LAUNCHES, relation=">=",
                           note="launches in one forward"),
                  Evidence(metric="median_kernel_duration_us", value=round(median_us, 3), threshold=TINY_KERNEL_US,
                           relation="<", note="each kernel costs about what launching it costs the host")],
        metrics={"duration_ns": statistics.median(durations),
                 **_typical(statistics.median, "sm_throughput_pct", kernels)},
    ), "many tiny launches"


def _redundant_passes(kernels: list[KernelProfile], per: dict[int, KernelClassification],
                      total: float) -> tuple[KernelClassification, str] | None:
    """Several memory-bound kernels taking most of the time: passes one fused kernel would remove."""
    memory_bound = [k for k in kernels if per[k.index].primary is Primary.memory]
    mem_share = sum(v(k.metrics.duration_ns) for k in memory_bound) / total
    if len(memory_bound) < REDUNDANT_KERNELS or mem_share < REDUNDANT_SHARE:
        return None
    return KernelClassification(
        index=-1, name=WHOLE, instances=len(kernels), duration_ns=total, time_share=1.0,
        primary=Primary.memory, secondary=Secondary.redundant_passes,
        confidence=round(min(0.95, 0.55 + 0.05 * len(memory_bound) + 0.2 * mem_share), 3),
        evidence=[Evidence(metric="memory_bound_kernels", value=len(memory_bound), threshold=REDUNDANT_KERNELS,
                           relation=">=", note="separate memory-bound passes over the data"),
                  Evidence(metric="memory_bound_time_share", value=round(mem_share, 3),
                           threshold=REDUNDANT_SHARE, relation=">=",
                           note="of the GPU time; one fused kernel would read and write the data once")],
        metrics={**_typical(statistics.mean, "dram_throughput_pct", memory_bound),
                 **_typical(statistics.mean, "sm_throughput_pct", memory_bound)},
        missing=sorted({name for k in memory_bound for name in per[k.index].missing}),
    ), "several memory-bound kernels"


def _typical(average: Callable[[list[float]], float], metric: str,
             kernels: list[KernelProfile]) -> dict[str, float]:
    """{metric: its average over the kernels that give it}, or {} when none does (never a 0 for them)."""
    values = [float(x) for k in kernels if (x := getattr(k.metrics, metric)) is not None]
    return {metric: average(values)} if values else {}


def _time_weighted(kernels: list[KernelProfile], per: dict[int, KernelClassification],
                   total: float) -> tuple[KernelClassification | None, str]:
    """The signature holding the largest share of the GPU time (its heaviest kernel's evidence)."""
    weights: dict[str, float] = defaultdict(float)
    best_of: dict[str, KernelClassification] = {}
    for k in kernels:
        c = per[k.index]
        if c.key is None:
            continue
        weights[c.key] += v(k.metrics.duration_ns)
        if c.key not in best_of or v(k.metrics.duration_ns) > best_of[c.key].duration_ns:
            best_of[c.key] = c
    if not weights:
        return None, "no kernel could be classified (no hardware counters)"
    n = len(kernels)
    key = max(weights, key=lambda key: (weights[key], key))
    share = weights[key] / total
    chosen = best_of[key].model_copy()
    chosen.index, chosen.name, chosen.instances = -1, WHOLE, n
    chosen.duration_ns, chosen.time_share = total, 1.0
    if n > 1:
        chosen.confidence = round(chosen.confidence * (0.5 + 0.5 * share), 3)
        chosen.evidence = [Evidence(metric="time_share", value=round(share, 3),
                                    note=f"share of the GPU time in kernels classified {key}")] + chosen.evidence
    return chosen, ("single kernel" if n == 1 else "time-weighted over kernels")
