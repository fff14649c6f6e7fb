"""Nsight Compute CSV output -> `KernelProfile` records (one per kernel instance, in launch order).

Reads the two pages `ncu` prints as CSV:

* the **raw** page (`--page raw --csv`): one row per kernel instance, one column per raw metric,
  a units row under the header. Metrics come from here, by their raw names.
* the **details** page (`--page details --csv`): one row per section metric or rule result.
  Rule findings (with estimated speedups) come from here; so do metrics when only this page
  exists (e.g. a live `--metrics` run, whose rows name the raw metric).

Both pages may come from a live run with `--print-units base` or from `--import`, which
auto-scales units (us, Gbyte, Kbyte/block) and writes thousands separators ("463,996"); values
are converted to base units here so either source gives the same numbers.

The same module reads what else a profiling run writes: ncu's own output (counters refused,
metrics it does not know: `counters_blocked_reason`, `unknown_metrics`) and, in timeline mode, a
torch.profiler Chrome trace (`kernels_from_trace`).

Plain Python (csv + pydantic): no torch, no ncu needed to parse.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kb_mcp.harness.profile_model import KernelMetrics, KernelProfile, RuleFinding

# Rules that fire on every kernel and say nothing about its bottleneck.
NOISE_RULES = frozenset({"MemoryL2Compression"})

# Warp stall reasons reported per issued instruction by the WarpStateStats section.
STALL_REASONS = (
    "barrier", "branch_resolving", "dispatch_stall", "drain", "gmma", "imc_miss", "lg_throttle",
    "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction",
    "not_selected", "selected", "short_scoreboard", "sleeping", "tex_throttle", "wait",
)
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"

# Canonical KernelMetrics field -> raw metric names, first one present wins.
DIRECT_METRICS: dict[str, tuple[str, ...]] = {
    "duration_ns": ("gpu__time_duration.sum",),
    "elapsed_cycles": ("gpc__cycles_elapsed.max",),
    "sm_throughput_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
    "memory_throughput_pct": ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",),
    "dram_throughput_pct": (
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    ),
    "l1_throughput_pct": ("l1tex__throughput.avg.pct_of_peak_sustained_active",),
    "l2_throughput_pct": ("lts__throughput.avg.pct_of_peak_sustained_elapsed",),
    "l1_hit_rate_pct": ("l1tex__t_sector_hit_rate.pct",),
    "l2_hit_rate_pct": ("lts__t_sector_hit_rate.pct",),
    "achieved_occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "theoretical_occupancy_pct": ("sm__maximum_warps_per_active_cycle_pct",),
    "registers_per_thread": ("launch__registers_per_thread",),
    "waves_per_sm": ("launch__waves_per_multiprocessor",),
    "threads_per_inst": ("smsp__thread_inst_executed_per_inst_executed.ratio",),
    "branch_efficiency_pct": ("smsp__sass_average_branch_targets_threads_uniform.pct",),
    "fma_pipe_pct": ("sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",),
    "xu_pipe_pct": ("sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",),
    "ipc": ("sm__inst_executed.avg.per_cycle_active",),
}

# Tensor pipes: the generic counter covers HMMA and Hopper's GMMA; the HMMA one is the fallback.
TENSOR_METRICS = (
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
)
SECTORS_GLOBAL = ("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum")
REQUESTS_GLOBAL = ("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum")
BANK_CONFLICTS = (
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
)
SHARED_INSTS = ("smsp__inst_executed_op_shared_ld.sum", "smsp__inst_executed_op_shared_st.sum")
LOCAL_REQUESTS = ("l1tex__t_requests_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_requests_pipe_lsu_mem_local_op_st.sum")
ATOMIC_REQUESTS = ("l1tex__t_requests_pipe_lsu_mem_global_op_atom.sum",
                   "l1tex__t_requests_pipe_lsu_mem_global_op_red.sum")
SHARED_MEM = ("launch__shared_mem_per_block_static", "launch__shared_mem_per_block_dynamic")
OCCUPANCY_LIMITS = {
    "registers": "launch__occupancy_limit_registers",
    "shared_mem": "launch__occupancy_limit_shared_mem",
    "warps": "launch__occupancy_limit_warps",
    "blocks": "launch__occupancy_limit_blocks",
}
# Shared-memory wavefronts: with the conflicts, they give the conflict rate where the shared
# instruction counts are missing (`--set full` has no smsp__inst_executed_op_shared_*), and beside
# the global sectors they say whether a busy L1 is busy with shared memory.
SHARED_WAVEFRONTS = (
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
)
# Extra metrics the classifier reads beyond KernelMetrics' own fields (kept in `extra`).
EXTRA_METRICS = (
    *SECTORS_GLOBAL,
    REQUESTS_GLOBAL[1],
    *SHARED_WAVEFRONTS,
    "smsp__inst_executed.sum",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
    "lts__d_atomic_input_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "launch__grid_size",
    "launch__block_size",
    "device__attribute_multiprocessor_count",
)


# The details page names section metrics by their label, not their raw name: (section, label) ->
# the raw metric the label shows (ncu 2025.x section files). A details page alone (the default of
# `ncu --import R --csv`) then still yields the headline metrics.
DETAILS_LABELS: dict[tuple[str, str], str] = {
    ("GPU Speed Of Light Throughput", "Duration"): "gpu__time_duration.sum",
    ("GPU Speed Of Light Throughput", "Elapsed Cycles"): "gpc__cycles_elapsed.max",
    ("GPU Speed Of Light Throughput", "Compute (SM) Throughput"): "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    ("GPU Speed Of Light Throughput", "Memory Throughput"):
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    ("GPU Speed Of Light Throughput", "DRAM Throughput"): "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    ("GPU Speed Of Light Throughput", "L1/TEX Cache Throughput"): "l1tex__throughput.avg.pct_of_peak_sustained_active",
    ("GPU Speed Of Light Throughput", "L2 Cache Throughput"): "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    ("Memory Workload Analysis", "L1/TEX Hit Rate"): "l1tex__t_sector_hit_rate.pct",
    ("Memory Workload Analysis", "L2 Hit Rate"): "lts__t_sector_hit_rate.pct",
    ("Compute Workload Analysis", "Executed Ipc Active"): "sm__inst_executed.avg.per_cycle_active",
    ("Instruction Statistics", "Executed Instructions"): "smsp__inst_executed.sum",
    ("Warp State Statistics", "Avg. Active Threads Per Warp"): "smsp__thread_inst_executed_per_inst_executed.ratio",
    ("Source Counters", "Branch Efficiency"): "smsp__sass_average_branch_targets_threads_uniform.pct",
    ("Launch Statistics", "Registers Per Thread"): "launch__registers_per_thread",
    ("Launch Statistics", "Waves Per SM"): "launch__waves_per_multiprocessor",
    ("Launch Statistics", "Static Shared Memory Per Block"): "launch__shared_mem_per_block_static",
    ("Launch Statistics", "Dynamic Shared Memory Per Block"): "launch__shared_mem_per_block_dynamic",
    ("Launch Statistics", "# SMs"): "device__attribute_multiprocessor_count",
    ("Launch Statistics", "Grid Size"): "launch__grid_size",
    ("Launch Statistics", "Block Size"): "launch__block_size",
    ("Occupancy", "Theoretical Occupancy"): "sm__maximum_warps_per_active_cycle_pct",
    ("Occupancy", "Achieved Occupancy"): "sm__warps_active.avg.pct_of_peak_sustained_active",
    ("Occupancy", "Block Limit Registers"): "launch__occupancy_limit_registers",
    ("Occupancy", "Block Limit Shared Mem"): "launch__occupancy_limit_shared_mem",
    ("Occupancy", "Block Limit Warps"): "launch__occupancy_limit_warps",
    ("Occupancy", "Block Limit SM"): "launch__occupancy_limit_blocks",
}


def requested_metrics() -> list[str]:
    """Every raw metric this parser reads: the profiler passes them to `ncu --metrics`."""
    names: list[str] = []
    for aliases in DIRECT_METRICS.values():
        names.extend(aliases)
    names.extend(TENSOR_METRICS)
    for group in (SECTORS_GLOBAL, REQUESTS_GLOBAL, BANK_CONFLICTS, SHARED_INSTS, LOCAL_REQUESTS,
                  ATOMIC_REQUESTS, SHARED_MEM, EXTRA_METRICS):
        names.extend(group)
    names.extend(OCCUPANCY_LIMITS.values())
    names.extend(STALL_METRIC.format(reason) for reason in STALL_REASONS)
    # SASS-patched metrics cost extra replay passes; they arrive with the SourceCounters section instead.
    return [n for n in dict.fromkeys(names) if "__sass_" not in n]


class NcuParseError(ValueError):
    """The text is not Nsight Compute CSV output of the expected page."""


# --- numbers and units ---------------------------------------------------------------------------

_TIME_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9}
_SI = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_SCALABLE = {"byte", "cycle", "hz", "inst", "sector", "request", "warp", "thread", "block", "register"}


def unit_factor(unit: str) -> float:
    """Multiplier that turns a value in `unit` into the base unit (ns, byte, cycle, hz, ...).

    Only the numerator scales: `Kbyte/block` -> 1000, `Gbyte/s` -> 1e9 (byte per second).
    """
    head = unit.split("/", 1)[0].strip()
    if head in _TIME_NS:
        return _TIME_NS[head] if "/" not in unit else 1.0
    if head and head[0] in _SI and head[1:].lower() in _SCALABLE:
        return _SI[head[0]]
    return 1.0


def parse_number(text: str, unit: str = "") -> float | None:
    """The value of one CSV cell in base units; None for empty, 'n/a' or 'no data' cells."""
    cleaned = text.strip().replace(",", "")
    if not cleaned:
        return None
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return value * unit_factor(unit)


def parse_dim3(text: str) -> tuple[int, int, int]:
    """'(256, 1, 1)' -> (256, 1, 1); missing parts count as 1."""
    parts = [int(p) for p in re.findall(r"\d+", text.replace(",", " "))]
    parts = (parts + [1, 1, 1])[:3]
    return parts[0], parts[1], parts[2]


# --- kernel names --------------------------------------------------------------------------------

_ANON = re.compile(r"\(anonymous namespace\)::|unnamed>::|`anonymous namespace'::")


def short_name(full: str) -> str:
    """Demangled signature -> bare function name, e.g.
    'void at::native::vectorized_elementwise_kernel<4, ...>(int, ...)' -> 'vectorized_elementwise_kernel'.
    """
    text = _ANON.sub("", full.strip())
    depth, out = 0, []
    for ch in text:  # drop template arguments and the parameter list, at any nesting depth
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif ch == "(" and depth == 0:
            break
        elif depth == 0:
            out.append(ch)
    name = "".join(out).strip()
    name = name.split()[-1] if name else full.strip()
    return name.rsplit("::", 1)[-1] or full.strip()


# --- CSV pages -----------------------------------------------------------------------------------


def _csv_rows(text: str) -> list[list[str]]:
    """CSV rows of ncu output, skipping the `==PROF==`/`==WARNING==` lines a live run interleaves."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("==")]
    return list(csv.reader(io.StringIO("\n".join(lines))))


@dataclass
class KernelRecord:
    """One kernel instance as read from the CSV pages, before it becomes a KernelProfile."""

    id: int
    full_name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    metrics: dict[str, float] = field(default_factory=dict)  # raw metric name -> base-unit value
    texts: dict[str, str] = field(default_factory=dict)  # non-numeric metric values
    findings: list[RuleFinding] = field(default_factory=list)
    cc: str = ""  # compute capability as the report prints it, e.g. '9.0'


def _strip_section_prefix(column: str) -> str:
    """'SM_A.TriageCompute.l1tex__throughput.avg...' -> 'l1tex__throughput.avg...'."""
    match = re.search(r"[a-z0-9]+__", column)
    return column[match.start():] if match and match.start() > 0 and "." in column[: match.start()] else column


def read_raw_page(text: str) -> list[KernelRecord]:
    """Parses `--page raw --csv` output: one record per kernel instance, in file order."""
    rows = _csv_rows(text)
    if not rows or "ID" not in rows[0] or "Kernel Name" not in rows[0]:
        raise NcuParseError("not an ncu raw page: the CSV has no 'ID' and 'Kernel Name' columns")
    header = rows[0]
    col = {name: i for i, name in enumerate(header)}
    body = rows[1:]
    units = [""] * len(header)
    if body and not body[0][col["ID"]].strip():  # the units row sits under the header
        units = body[0] + [""] * (len(header) - len(body[0]))
        body = body[1:]
    identity = {"ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
                "Block Size", "Grid Size", "Device", "CC"}
    records = []
    for row in body:
        if len(row) < len(header):
            row = row + [""] * (len(header) - len(row))
        rec = KernelRecord(
            id=int(row[col["ID"]]),
            full_name=row[col["Kernel Name"]],
            grid=parse_dim3(row[col["Grid Size"]]) if "Grid Size" in col else (1, 1, 1),
            block=parse_dim3(row[col["Block Size"]]) if "Block Size" in col else (1, 1, 1),
            cc=row[col["CC"]].strip() if "CC" in col else "",
        )
        for i, name in enumerate(header):
            if name in identity:
                continue
            key = _strip_section_prefix(name)
            value = parse_number(row[i], units[i])
            if value is None:
                rec.texts.setdefault(key, row[i])
            elif key == name or key not in rec.metrics:  # a plain column wins over a prefixed copy
                rec.metrics[key] = value
        records.append(rec)
    return records


def read_details_page(text: str) -> list[KernelRecord]:
    """Parses `--page details --csv` output: metrics by name (or label) and rule findings per kernel."""
    rows = _csv_rows(text)
    if not rows or "ID" not in rows[0] or "Metric Name" not in rows[0]:
        raise NcuParseError("not an ncu details page: the CSV has no 'ID' and 'Metric Name' columns")
    header = rows[0]
    col = {name: i for i, name in enumerate(header)}

    def cell(row: list[str], name: str) -> str:
        i = col.get(name)
        return row[i] if i is not None and i < len(row) else ""

    by_id: dict[int, KernelRecord] = {}
    seen_rules: set[tuple[int, str, str]] = set()
    for row in rows[1:]:
        if not cell(row, "ID").strip().isdigit():
            continue
        kid = int(cell(row, "ID"))
        rec = by_id.get(kid)
        if rec is None:
            rec = by_id[kid] = KernelRecord(
                id=kid,
                full_name=cell(row, "Kernel Name"),
                grid=parse_dim3(cell(row, "Grid Size")),
                block=parse_dim3(cell(row, "Block Size")),
                cc=cell(row, "CC").strip(),
            )
        rule = cell(row, "Rule Name").strip()
        if rule:
            message = " ".join(cell(row, "Rule Description").split())
            key = (kid, rule, message)
            if rule in NOISE_RULES or key in seen_rules:
                continue
            seen_rules.add(key)
            rec.findings.append(
                RuleFinding(
                    rule=rule,
                    type=cell(row, "Rule Type").strip(),
                    section=cell(row, "Section Name").strip(),
                    message=message,
                    estimated_speedup_pct=parse_number(cell(row, "Estimated Speedup")),
                    speedup_type=cell(row, "Estimated Speedup Type").strip() or None,
                )
            )
            continue
        name = cell(row, "Metric Name").strip()
        if not name:
            continue
        name = DETAILS_LABELS.get((cell(row, "Section Name").strip(), name), name)
        value = parse_number(cell(row, "Metric Value"), cell(row, "Metric Unit"))
        if value is None:
            rec.texts.setdefault(name, cell(row, "Metric Value"))
        else:
            rec.metrics.setdefault(name, value)
    return [by_id[k] for k in sorted(by_id)]


# --- records -> profile model --------------------------------------------------------------------


def _first(metrics: Mapping[str, float], names: Iterable[str]) -> float | None:
    for name in names:
        if name in metrics:
            return metrics[name]
    return None


def _sum(metrics: Mapping[str, float], names: Iterable[str]) -> float | None:
    values = [metrics[n] for n in names if n in metrics]
    return sum(values) if values else None


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def occupancy_limiter(metrics: Mapping[str, float]) -> str | None:
    """The resource allowing the fewest resident blocks per SM (ties: the first of registers,
    shared_mem, warps, blocks, the order in which a programmer can act on them)."""
    limits = {name: metrics[raw] for name, raw in OCCUPANCY_LIMITS.items() if raw in metrics}
    if not limits:
        return None
    low = min(limits.values())
    return next(name for name, value in limits.items() if value == low)


def kernel_metrics(metrics: Mapping[str, float]) -> KernelMetrics:
    """Raw metric name -> base-unit value, into the canonical KernelMetrics (None where absent)."""
    fields: dict[str, object] = {name: _first(metrics, raws) for name, raws in DIRECT_METRICS.items()}
    tensor = [metrics[n] for n in TENSOR_METRICS if n in metrics]
    fields["tensor_pipe_pct"] = max(tensor) if tensor else None
    fields["shared_mem_per_block_bytes"] = _sum(metrics, SHARED_MEM)
    fields["occupancy_limiter"] = occupancy_limiter(metrics)
    # Loads only (the field's definition); store sectors/requests stay in `extra` for the classifier.
    fields["sectors_per_request"] = _ratio(metrics.get(SECTORS_GLOBAL[0]), metrics.get(REQUESTS_GLOBAL[0]))
    conflicts = _sum(metrics, BANK_CONFLICTS)
    fields["bank_conflicts"] = conflicts
    fields["bank_conflicts_per_request"] = _ratio(conflicts, _sum(metrics, SHARED_INSTS))
    fields["local_spill_requests"] = _sum(metrics, LOCAL_REQUESTS)
    fields["atomic_requests"] = _sum(metrics, ATOMIC_REQUESTS)
    stalls = {}
    for reason in STALL_REASONS:
        value = metrics.get(STALL_METRIC.format(reason))
        if value is not None and reason != "selected":  # 'selected' is issuing, not stalling
            stalls[reason] = round(value, 4)
    fields["warp_stalls"] = dict(sorted(stalls.items(), key=lambda kv: -kv[1]))
    fields["extra"] = {name: metrics[name] for name in EXTRA_METRICS if name in metrics}
    return KernelMetrics(**fields)


def to_profiles(raw: list[KernelRecord] | None, details: list[KernelRecord] | None = None) -> list[KernelProfile]:
    """Joins raw-page and details-page records by kernel ID into KernelProfiles in launch order.

    Metrics come from the raw page where there is one (raw names), else from the details page;
    rule findings always come from the details page.
    """
    raw_by_id = {r.id: r for r in raw or []}
    det_by_id = {r.id: r for r in details or []}
    profiles = []
    for index, kid in enumerate(sorted(set(raw_by_id) | set(det_by_id))):
        base = raw_by_id.get(kid) or det_by_id[kid]
        merged = dict(det_by_id[kid].metrics) if kid in det_by_id else {}
        merged.update(raw_by_id[kid].metrics if kid in raw_by_id else {})
        findings = det_by_id[kid].findings if kid in det_by_id else []
        profiles.append(
            KernelProfile(
                index=index,
                name=short_name(base.full_name),
                full_name=base.full_name,
                grid=base.grid,
                block=base.block,
                metrics=kernel_metrics(merged),
                findings=list(findings),
            )
        )
    return profiles


def parse_ncu_csv(raw_text: str | None, details_text: str | None = None) -> list[KernelProfile]:
    """Raw and/or details page text -> KernelProfiles in launch order."""
    if raw_text is None and details_text is None:
        raise NcuParseError("nothing to parse: give the raw page, the details page, or both")
    raw = read_raw_page(raw_text) if raw_text is not None else None
    details = read_details_page(details_text) if details_text is not None else None
    return to_profiles(raw, details)


PERM_ERROR = "ERR_NVGPUCTRPERM"  # ncu's word for counters this user may not read


def counters_blocked_reason(output: str) -> str | None:
    """The reason counters are unavailable, if ncu's output says so."""
    if PERM_ERROR in output:
        return (
            f"{PERM_ERROR}: this user may not read the GPU performance counters (containers need "
            "--cap-add SYS_ADMIN, or the driver option NVreg_RestrictProfilingToAdminUsers=0); "
            "per-kernel timings only"
        )
    return None


def unknown_metrics(output: str, metrics: Sequence[str]) -> list[str]:
    """The requested metrics that ncu's error lines name (by full name or by base counter name)."""
    errors = "\n".join(line for line in output.splitlines() if "ERROR" in line or "metric" in line.lower())
    return [m for m in metrics if re.search(re.escape(m.split(".")[0]) + r"(?![A-Za-z0-9_])", errors)]


def kernels_from_trace(trace: dict[str, Any]) -> list[KernelProfile]:
    """Kernel events of a torch.profiler Chrome trace -> KernelProfiles (timings only), in launch order."""
    events = [
        e for e in trace.get("traceEvents", [])
        if isinstance(e, dict) and e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"
    ]
    events.sort(key=lambda e: float(e.get("ts", 0.0)))
    kernels = []
    for index, event in enumerate(events):
        args = event.get("args", {}) or {}
        grid = tuple((list(args.get("grid", [1, 1, 1])) + [1, 1, 1])[:3])
        block = tuple((list(args.get("block", [1, 1, 1])) + [1, 1, 1])[:3])
        regs = args.get("registers per thread")
        smem = args.get("shared memory")
        full = str(event.get("name", "?"))
        kernels.append(
            KernelProfile(
                index=index,
                name=short_name(full),
                full_name=full,
                grid=(int(grid[0]), int(grid[1]), int(grid[2])),
                block=(int(block[0]), int(block[1]), int(block[2])),
                metrics=KernelMetrics(
                    duration_ns=float(event.get("dur", 0.0)) * 1e3,  # trace durations are in us
                    registers_per_thread=float(regs) if regs is not None else None,
                    shared_mem_per_block_bytes=float(smem) if smem is not None else None,
                ),
            )
        )
    return kernels
