"""A user's own Nsight Compute report -> a `Profile`, without running anything.

Accepted: a `.ncu-rep` report, or CSV exports of one (the raw page, the details page, or both).

* `.ncu-rep`: read with NVIDIA's `ncu_report` Python module (shipped in the Nsight Compute install's
  `extras/python`) when it can be found: exact values in base units, by raw metric name. The rule
  findings come from the details page that the `ncu` CLI of the same install exports. Without the
  module, the `ncu` CLI exports both pages (`--print-units base`). Without either, the error says
  how to export the pages elsewhere.
* CSV: the page is recognised by its columns (the details page has 'Metric Name'); values may be
  auto-scaled (`us`, `Gbyte`) with thousands separators, as `ncu --import` prints them unless
  `--print-units base`; both are converted to base units (`profiling.ncu_parse`).

Plain Python plus, for `.ncu-rep` only, the Nsight Compute install; no torch, no GPU.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kb_mcp.harness.profile_model import Profile
from kb_mcp.profiling import ncu_parse
from kb_mcp.profiling.ncu_parse import KernelRecord, NcuParseError

if TYPE_CHECKING:
    from kb_mcp.profiling.ncu_run import Spawner

MAX_CSV_BYTES = 512 * 1024 * 1024  # a raw page of ~100k launches; larger is not a profile we can hold
EXPORT_HINT = (
    "export its pages on a machine with Nsight Compute and pass the CSV files instead: "
    "`ncu --import {rep} --page raw --csv --print-units base > {stem}.raw.csv` and "
    "`ncu --import {rep} --page details --csv --print-units base > {stem}.details.csv`"
)
# Where Nsight Compute installs keep the Python report module (besides the ncu executable's own folder).
MODULE_DIRS = ("/opt/nvidia/nsight-compute/*/extras/python", "/usr/local/cuda*/nsight-compute*/extras/python")


class ReportImportError(ValueError):
    """The files are not an Nsight Compute report this machine can read; the message says what to do."""


def import_report(paths: Sequence[str | os.PathLike[str]], *, profile_id: str, problem: str | None = None) -> Profile:
    """Reads a `.ncu-rep` or its CSV pages (raw, details or both) into a stored-profile record."""
    files = [Path(p).expanduser() for p in paths]
    if not files:
        raise ReportImportError("no report given: pass a .ncu-rep file, or its raw and/or details page as CSV")
    for f in files:
        if not f.is_file():
            raise ReportImportError(f"report file not found: {f}")
    reps = [f for f in files if f.suffix == ".ncu-rep"]
    if reps and len(files) > 1:
        raise ReportImportError("pass a .ncu-rep file alone (it holds every page), or CSV exports without it")
    notes: list[str] = []
    if reps:
        raw, details = read_ncu_rep(reps[0], notes)
    else:
        raw, details = read_csv_pages(files)
    kernels = ncu_parse.to_profiles(raw, details)
    if not kernels:
        raise ReportImportError(f"{', '.join(map(str, files))}: the report holds no kernel launches")
    base = (raw or details or [])[0]
    notes.append(f"imported from {', '.join(str(f.resolve()) for f in files)}: durations are the profiler's "
                 "(locked clocks, flushed caches), for comparing kernels, not speedup timings")
    if details is None:
        notes.append("no details page: the profiler's rule findings are missing (pass the details page too)")
    return Profile(
        profile_id=profile_id,
        problem=problem or files[0].name.split(".")[0],
        device=base.texts.get("device__attribute_display_name", ""),
        arch=_arch(base.cc),
        counters_available=any(k.metrics.sm_throughput_pct is not None or k.metrics.memory_throughput_pct is not None
                               for k in kernels),
        total_gpu_time_ns=sum(k.metrics.duration_ns or 0.0 for k in kernels),
        total_elapsed_cycles=sum(k.metrics.elapsed_cycles or 0.0 for k in kernels),
        kernels=kernels,
        notes=notes,
        imported_from=[str(f.resolve()) for f in files],
    )


def _arch(cc: str) -> str:
    """'9.0' -> 'sm_90' ('' when the report does not say)."""
    parts = cc.strip().split(".")
    return f"sm_{parts[0]}{parts[1] if len(parts) > 1 else '0'}" if parts[0].isdigit() else ""


# --- CSV exports ---------------------------------------------------------------------------------


def read_csv_pages(files: Sequence[Path]) -> tuple[list[KernelRecord] | None, list[KernelRecord] | None]:
    """(raw records, details records) of one or two CSV exports, each page recognised by its columns."""
    raw = details = None
    for f in files:
        if f.stat().st_size > MAX_CSV_BYTES:
            raise ReportImportError(f"{f}: {f.stat().st_size / 1e6:.0f} MB is more than a profile export holds")
        text = f.read_text(errors="replace")
        try:
            if _is_details(text):
                if details is not None:
                    raise ReportImportError(f"{f}: a second details page; pass one raw and/or one details page")
                details = ncu_parse.read_details_page(text)
            else:
                if raw is not None:
                    raise ReportImportError(f"{f}: a second raw page; pass one raw and/or one details page")
                raw = ncu_parse.read_raw_page(text)
        except NcuParseError as exc:
            raise ReportImportError(f"{f}: {exc} (expected `ncu --csv --page raw` or `--page details` output)") from exc
    return raw, details


def _is_details(text: str) -> bool:
    for line in text.splitlines():
        if line.strip() and not line.startswith("=="):
            return "Metric Name" in line
    return False


# --- .ncu-rep ------------------------------------------------------------------------------------


def read_ncu_rep(report: Path, notes: list[str]) -> tuple[list[KernelRecord] | None, list[KernelRecord] | None]:
    """Metrics through `ncu_report` where it is installed, findings through the CLI; else both pages
    through the CLI; else a ReportImportError that says how to export the pages. The report is the
    caller's file: both the module and ncu read it in the sandbox, never in this process."""
    from kb_mcp.harness.sandbox.sandbox import detect
    from kb_mcp.profiling import ncu_run  # the ncu CLI helpers (find_ncu, export_pages)

    hint = EXPORT_HINT.format(rep=report.name, stem=report.name.removesuffix(".ncu-rep"))
    ncu = ncu_run.find_ncu()
    module_dir = find_report_module_dir(ncu)
    raw = None
    if module_dir is not None:
        try:
            raw = read_in_sandbox(ncu_run.Spawner(detect(), None, ncu), module_dir, report)
        except (ncu_run.ProfilerError, OSError, RuntimeError, ValueError) as exc:
            notes.append(f"ncu_report could not read the report ({type(exc).__name__}: {str(exc)[:300]}); "
                         "used the ncu CLI")
    if ncu is None:
        if raw is not None:
            notes.append("no ncu CLI here: the profiler's rule findings (details page) are missing")
            return raw, None
        what = "ncu_report could not read it and there is no ncu" if module_dir else \
            "this machine has neither Nsight Compute's ncu_report module nor ncu"
        raise ReportImportError(f"{report}: {what}; {hint}")
    try:  # the report is the caller's file: ncu reads it in the sandbox
        raw_text, details_text = ncu_run.export_pages(ncu, report, ncu_run.Spawner(detect(), None, ncu))
    except (ncu_run.ProfilerError, OSError, RuntimeError) as exc:
        raise ReportImportError(f"{report}: ncu could not read it ({exc}); {hint}") from exc
    details = ncu_parse.read_details_page(details_text) if details_text.strip() else None
    cli_raw = ncu_parse.read_raw_page(raw_text)
    if raw is None:
        raw = cli_raw
    for mine, theirs in zip(raw, cli_raw):  # the module may not expose the device's compute capability
        mine.cc = mine.cc or theirs.cc
    return raw, _aligned(raw, details, notes)


def _aligned(raw: list[KernelRecord], details: list[KernelRecord] | None,
             notes: list[str]) -> list[KernelRecord] | None:
    """Details records renumbered to the raw records' ids (both list launches in report order)."""
    if details is None:
        return None
    same = len(details) == len(raw) and all(
        ncu_parse.short_name(d.full_name) == ncu_parse.short_name(r.full_name) for d, r in zip(details, raw))
    if not same:
        notes.append("the details page lists other launches than the metrics: its rule findings were left out")
        return None
    for d, r in zip(details, raw):
        d.id = r.id
    return details


def find_report_module_dir(ncu: str | None) -> Path | None:
    """The folder holding NVIDIA's `ncu_report` module (an Nsight Compute install's extras/python), or None.
    Found by path only: the module is imported in the sandboxed reader, never here."""
    spec = importlib.util.find_spec("ncu_report")
    if spec is not None and spec.origin:
        return Path(spec.origin).parent
    dirs = [str(Path(ncu).resolve().parent / "extras" / "python")] if ncu else []
    for pattern in MODULE_DIRS:
        dirs.extend(sorted(glob.glob(pattern), reverse=True))
    return next((Path(d) for d in dirs if Path(d, "ncu_report.py").is_file()), None)


def read_in_sandbox(spawner: Spawner, module_dir: Path, report: Path, timeout_s: float = 120.0) -> list[KernelRecord]:
    """The report's launches, read by `ncu_report` in a sandboxed process (`harness.worker.ncu_report_reader`)."""
    from kb_mcp.harness.sandbox.sandbox import kill_group
    from kb_mcp.harness.sandbox.scratch import new_scratch
    from kb_mcp.profiling import ncu_run

    scratch = new_scratch("ncu-report")
    cmd = [sys.executable, "-m", "kb_mcp.harness.worker.ncu_report_reader", str(module_dir), str(report)]
    proc = spawner.sandbox.popen(cmd, spawner.grant(scratch, role="tool", ro=(report, module_dir)),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ncu_run.ProfilerError(f"ncu_report did not read {report} within {timeout_s:.0f} s") from None
        if proc.returncode != 0:
            raise ncu_run.ProfilerError(err.strip()[-500:] or f"exit status {proc.returncode}")
    finally:
        kill_group(proc)
        shutil.rmtree(scratch, ignore_errors=True)
    try:
        return [KernelRecord(id=int(r["id"]), full_name=str(r["full_name"]), grid=_dim3(r["grid"]),
                             block=_dim3(r["block"]), metrics={str(k): float(v) for k, v in r["metrics"].items()},
                             texts={str(k): str(v) for k, v in r["texts"].items()}, cc=str(r["cc"]))
                for r in json.loads(out)]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ncu_run.ProfilerError(f"the report reader's output is not a list of launches ({exc})") from exc


def _dim3(value: Iterable[Any]) -> tuple[int, int, int]:
    x, y, z = (int(v) for v in value)
    return x, y, z
