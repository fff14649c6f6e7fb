#!/usr/bin/env python3
"""Records the Nsight Compute fixtures of the profiling tests, on a GPU machine, in one batch.

    source .whl/prelude.sh && python3 scripts/record_fixtures.py --out "$OUT"

1. Compiles every planted-bottleneck program in tests/fixtures/planted/ with nvcc (sm_90).
2. Runs each under ncu exactly as `profile_kernel` does (same sections, metrics and NVTX range,
   built by `kb_mcp.profiling.profiler`), exports the raw and details pages with base units, and keeps
   only the columns and rows the parser reads (the recorded text stays ncu's own output).
3. Profiles tests/profiling/problems/relu_mul_add.py end to end (reference and fused candidate),
   records a torch.profiler trace of the timing fallback, and probes ncu as an unprivileged user
   (to capture ERR_NVGPUCTRPERM if this machine restricts counters).
4. Measures the cost of the profile against `--set full` and an unprofiled run.

Everything lands in <out>/fixtures.tar.gz (and record.log); copy the files you want to keep into
tests/fixtures/ncu/.

With `--set-full`, it records instead what a user brings from outside the project: each planted
program of SET_FULL_PROGRAMS (or `--only`) under plain `ncu --set full` (NVTX range only), exported
with base units, into fixtures/set_full/ (copy to tests/fixtures/ncu/set_full/):

    source .whl/prelude.sh && python3 scripts/record_fixtures.py --set-full --out "$OUT"
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLANTED = ROOT / "tests" / "fixtures" / "planted"
PROBLEMS = ROOT / "tests" / "profiling" / "problems"
IDENTITY = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
            "Block Size", "Grid Size", "Device", "CC"]
# Kept beside the parsed metrics so later classifier work can be checked against the same recordings.
KEEP_ALSO = re.compile(
    r"^(sm__inst_executed_pipe_(lsu|alu|fma|fp16|xu|tensor\w*)\.avg\.pct_of_peak_sustained_active"
    r"|sm__pipe_(alu|fma|fmaheavy|shared|tensor\w*)_cycles_active\.avg\.pct_of_peak_sustained_active"
    r"|l1tex__t_(sectors|requests)_pipe_lsu_mem_(global|local)_op_\w+\.sum"
    r"|l1tex__data_pipe_lsu_wavefronts_mem_shared_op_(ld|st)\.sum"
    r"|lts__t_sectors_srcunit_tex_op_(read|write|atom|red)\.sum"
    r"|smsp__inst_executed_op_(global|local|shared)_(ld|st|atom|red)\.sum"
    r"|smsp__thread_inst_executed_pred_on_per_inst_executed\.ratio"
    r"|sm__warps_active\.avg\.per_cycle_active|smsp__warps_eligible\.avg\.per_cycle_active"
    r"|smsp__issue_active\.avg\.per_cycle_active|launch__\w+|dram__bytes_(read|write)\.sum)$"
)


# Outside-style recordings: the 32-way bank-conflict kernel and the WMMA kernels the issue reports as
# misread, plus programs whose label the other signals must keep.
SET_FULL_PROGRAMS = ("bank_conflicts", "wmma_global", "tensor_gemm", "cublas_gemm", "naive_gemm", "stream",
                     "strided", "fma")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def nvcc_flags(source: Path) -> list[str]:
    match = re.search(r"//\s*nvcc-flags:\s*(.*)", source.read_text())
    return match.group(1).split() if match else []


def wheel_library_flags(flags: list[str]) -> list[str]:
    """-lcublas against the cuBLAS that ships in pip wheels (nvidia.cublas), when the toolkit lacks it."""
    if "-lcublas" not in flags:
        return flags
    try:
        import nvidia.cublas as pkg
    except ImportError:
        return flags
    base = Path(next(iter(pkg.__path__)))
    libs = sorted((base / "lib").glob("libcublas*.so*"))
    rest = [f for f in flags if f != "-lcublas"]
    return rest + [f"-I{base / 'include'}", f"-Xlinker=-rpath={base / 'lib'}", *map(str, libs)]


def compile_one(source: Path, build: Path) -> tuple[str, int, str]:
    exe = build / source.stem
    log_text = ""
    for flags in (nvcc_flags(source), wheel_library_flags(nvcc_flags(source))):
        cmd = ["nvcc", "-O3", "-arch=sm_90", "-lineinfo", "-Xptxas", "-v", *flags, "-o", str(exe), str(source)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log_text += " ".join(cmd) + "\n" + proc.stdout + proc.stderr + "\n"
        if proc.returncode == 0:
            break
    return source.stem, proc.returncode, log_text


def trim_raw(text: str, keep: set[str]) -> str:
    """Only the identity columns and the metrics we read, rows unchanged (header, units, kernels)."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("==")]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    cols = [i for i, name in enumerate(rows[0]) if name in IDENTITY or name in keep or KEEP_ALSO.match(name)]
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    for row in rows:
        writer.writerow([row[i] if i < len(row) else "" for i in cols])
    return out.getvalue()


def trim_details(text: str, max_kernels: int = 4) -> str:
    """Only the rule-result rows of the first `max_kernels` launches (the parser takes metrics from the
    raw page; a program of many identical launches repeats the same findings for each)."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("==")]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header = rows[0]
    rule = header.index("Rule Name")
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    writer.writerow(header)
    for row in rows[1:]:
        if len(row) > rule and row[rule].strip() and row[0].isdigit() and int(row[0]) < max_kernels:
            writer.writerow(row)
    return out.getvalue()


def record_program(name: str, exe: Path, out: Path, full: Path, ncu: str) -> dict:
    import shutil

    from kb_mcp.harness.sandbox.sandbox import detect
    from kb_mcp.profiling import ncu_parse, profiler

    options = profiler.ProfileOptions()
    scratch = Path(tempfile.mkdtemp())
    base = scratch / name
    local = scratch / exe.name  # the sandbox sees its scratch folder, not where the program was built
    shutil.copy2(exe, local)
    spawner = profiler.Spawner(detect(), scratch / "cache", ncu)
    run, dropped = profiler.profile_target(ncu, [str(local)], base, spawner=spawner, scratch=scratch, options=options)
    entry = {"program": name, "returncode": run.returncode, "passes": run.passes, "wall_s": round(run.wall_s, 2),
             "dropped_metrics": dropped,
             "ncu_command": " ".join(profiler.ncu_command(ncu, base, [str(exe)]))}
    (full / f"{name}.ncu.log").write_text(run.output)
    report = Path(str(base) + ".ncu-rep")
    if not report.is_file():
        entry["error"] = run.output[-2000:]
        return entry
    t0 = time.perf_counter()
    raw, details = profiler.export_pages(ncu, report, spawner)
    entry["export_s"] = round(time.perf_counter() - t0, 2)
    (full / f"{name}.raw.csv").write_text(raw)
    (full / f"{name}.details.csv").write_text(details)
    keep = set(ncu_parse.requested_metrics())
    (out / f"{name}.raw.csv").write_text(trim_raw(raw, keep))
    (out / f"{name}.details.csv").write_text(trim_details(details))
    kernels = ncu_parse.parse_ncu_csv(raw, details)
    entry["kernels"] = len(kernels)
    entry["summary"] = [
        {"name": k.name, "us": round((k.metrics.duration_ns or 0) / 1e3, 2),
         "sm": k.metrics.sm_throughput_pct, "mem": k.metrics.memory_throughput_pct,
         "dram": k.metrics.dram_throughput_pct, "rules": [f.rule for f in k.findings]}
        for k in kernels[:3]
    ]
    shutil.copy(report, full / f"{name}.ncu-rep") if name in ("stream", "tiny_launches") else None
    return entry


def trim_details_full(text: str, max_kernels: int = 4) -> str:
    """Every row (section metrics by label and rule results) of the first `max_kernels` launches."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("==")]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    writer.writerow(rows[0])
    for row in rows[1:]:
        if row and row[0].isdigit() and int(row[0]) < max_kernels:
            writer.writerow(row)
    return out.getvalue()


def record_set_full(name: str, exe: Path, out: Path, full: Path, ncu: str) -> dict:
    """One planted program under `ncu --set full`, as a user records it outside the project."""
    from kb_mcp.harness.profile_model import Profile
    from kb_mcp.policy.classify import classify_profile
    from kb_mcp.profiling import ncu_parse, profiler

    base = Path(tempfile.mkdtemp()) / name
    cmd = [ncu, "--set", "full", "--nvtx", "--nvtx-include", "kbmcp/", "-o", str(base), "-f", str(exe)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    entry = {"program": name, "returncode": proc.returncode, "wall_s": round(time.perf_counter() - t0, 2),
             "ncu_command": " ".join(cmd)}
    (full / f"{name}.set_full.ncu.log").write_text(proc.stdout + proc.stderr)
    report = Path(str(base) + ".ncu-rep")
    if not report.is_file():
        entry["error"] = (proc.stdout + proc.stderr)[-2000:]
        return entry
    from kb_mcp.harness.sandbox.sandbox import detect

    raw, details = profiler.export_pages(ncu, report, profiler.Spawner(detect(), base.parent / "cache", ncu))
    (full / f"{name}.set_full.raw.csv").write_text(raw)
    (full / f"{name}.set_full.details.csv").write_text(details)
    keep = set(ncu_parse.requested_metrics())
    (out / f"{name}.raw.csv").write_text(trim_raw(raw, keep))
    (out / f"{name}.details.csv").write_text(trim_details_full(details))
    kernels = ncu_parse.parse_ncu_csv(raw, details)
    overall = classify_profile(Profile(profile_id="p_000000000000", problem=name, kernels=kernels)).overall
    entry["label"] = overall.key if overall else None
    entry["evidence"] = [(e.metric, e.value) for e in overall.evidence] if overall else []
    return entry


def cost_run(label: str, cmd: list[str]) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    passes = [int(p) for p in re.findall(r"-\s*(\d+)\s+pass", proc.stdout + proc.stderr)]
    return {"label": label, "wall_s": round(wall, 2), "rc": proc.returncode, "kernels": len(passes),
            "passes": max(passes) if passes else 0}


def cost_comparison(ncu: str, exe: Path) -> list[dict]:
    from kb_mcp.profiling import profiler

    tmp = Path(tempfile.mkdtemp())
    results = [cost_run("unprofiled", [str(exe)])]
    results.append(cost_run("profile_kernel sections", profiler.ncu_command(ncu, tmp / "a", [str(exe)])))
    results.append(cost_run("+ SourceCounters",
                            profiler.ncu_command(ncu, tmp / "b", [str(exe)], source_counters=True)))
    nvtx = ["--nvtx", "--nvtx-include", "kbmcp/"]
    results.append(cost_run("--set full", [ncu, *nvtx, "--set", "full", "-o", str(tmp / "c"), "-f", str(exe)]))
    results.append(cost_run("--set basic", [ncu, *nvtx, "--set", "basic", "-o", str(tmp / "d"), "-f", str(exe)]))
    return results


def perm_probe(ncu: str, exe: Path, full: Path) -> dict:
    """Runs ncu as an unprivileged user; on machines that restrict counters this prints ERR_NVGPUCTRPERM."""
    box = Path(tempfile.mkdtemp())
    box.chmod(0o777)
    target = box / exe.name
    shutil.copy(exe, target)
    target.chmod(0o755)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(box), "TMPDIR": str(box)}
    cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", ncu,
           "--metrics", "gpu__time_duration.sum", str(target)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=box, env=env, timeout=120)
        text = f"$ {' '.join(cmd)}\n[exit {proc.returncode}]\n{proc.stdout}{proc.stderr}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        text = f"$ {' '.join(cmd)}\n[failed to run: {exc}]\n"
    (full / "perm_probe.txt").write_text(text)
    return {"perm_error_seen": "ERR_NVGPUCTRPERM" in text, "head": text[:600]}


def torch_end_to_end(out: Path, full: Path) -> dict:
    """Profiles the small torch problem (reference, candidate; counters and timeline) and keeps a trace."""
    from kb_mcp.harness.problem import load_problem
    from kb_mcp.harness.protocol import DriverSpec
    from kb_mcp.harness.sandbox.sandbox import Grant, detect
    from kb_mcp.profiling import profiler

    problem = load_problem(str(PROBLEMS / "relu_mul_add.py"))
    candidate = (PROBLEMS / "relu_mul_add_fused.py").read_text()
    cache = Path(tempfile.mkdtemp())
    results: dict[str, object] = {}
    for label, cand, counters in (("reference", None, True), ("candidate", candidate, True),
                                  ("reference_timeline", None, False)):
        t0 = time.perf_counter()
        prof = profiler.profile(problem, cand, profile_id=f"p_{label[:3].encode().hex()}00000000",
                                report_base=full / f"torch_{label}", cache_dir=cache,
                                options=profiler.ProfileOptions(counters=counters))
        wall = time.perf_counter() - t0
        (full / f"torch_{label}.profile.json").write_text(prof.model_dump_json(indent=1))
        results[label] = {"wall_s": round(wall, 2), "kernels": [k.name for k in prof.kernels],
                          "counters": prof.counters_available, "notes": prof.notes}
        log(f"torch {label}: {results[label]}")
    # A raw torch.profiler trace of the reference, for the fallback parser's test.
    work = Path(tempfile.mkdtemp())
    spec = DriverSpec(problem_source=problem.source, problem_module="kbmcp_problem_trace", mode="timeline",
                      workdir=str(work / "src"), report_path=str(work / "driver.json"),
                      trace_path=str(work / "trace.json"))
    (work / "spec.json").write_text(spec.model_dump_json())
    rc, output = detect().run([sys.executable, "-m", "kb_mcp.harness.worker.profile_driver", str(work / "spec.json")],
                              Grant(role="driver", scratch=work, gpu=True), timeout_s=300)
    results["trace_driver_rc"] = rc
    if (work / "trace.json").is_file():
        trace = json.loads((work / "trace.json").read_text())
        (full / "torch_trace_full.json").write_text(json.dumps(trace))
        keep = [e for e in trace.get("traceEvents", [])
                if isinstance(e, dict) and str(e.get("cat", "")).lower() in ("kernel", "gpu_memcpy", "gpu_memset")]
        (out / "timeline_relu_mul_add.trace.json").write_text(json.dumps({"traceEvents": keep}, indent=1))
    else:
        results["trace_error"] = output[-2000:]
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--out", default=os.environ.get("OUT", "out"))
    parser.add_argument("--only", nargs="*", help="planted program names (default: all)")
    parser.add_argument("--skip-extras", action="store_true", help="planted programs only")
    parser.add_argument("--budget-s", type=float, default=250.0, help="skip later extras past this many seconds")
    parser.add_argument("--set-full", action="store_true",
                        help="record outside-style `ncu --set full` profiles of SET_FULL_PROGRAMS into set_full/")
    args = parser.parse_args()
    from kb_mcp.profiling import profiler

    dest = Path(args.out)
    dest.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    stage = Path(tempfile.mkdtemp())
    out, full, build = stage / "ncu", stage / "full", Path(tempfile.mkdtemp()) / "bin"
    for d in (out, full, build):
        d.mkdir()
    ncu = profiler.find_ncu()
    if ncu is None:
        log("no ncu found")
        return 1
    manifest: dict = {"date": time.strftime("%Y-%m-%d"), "ncu": subprocess.run([ncu, "--version"], capture_output=True,
                                                                                text=True).stdout.strip().splitlines()[-1]}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True)
        manifest["device"] = smi.stdout.strip()
    except OSError:
        manifest["device"] = "unknown (no nvidia-smi)"
    log(f"device {manifest['device']}, {manifest['ncu']}")

    sources = sorted(PLANTED.glob("*.cu"))
    wanted = args.only or (SET_FULL_PROGRAMS if args.set_full else None)
    if wanted:
        sources = [s for s in sources if s.stem in wanted]
    if args.set_full:
        out = stage / "set_full"
        out.mkdir()
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        compiled = list(pool.map(lambda s: compile_one(s, build), sources))
    (full / "compile.log").write_text("\n\n".join(c[2] for c in compiled))
    manifest["programs"] = []
    for name, rc, text in compiled:
        if rc != 0:
            log(f"compile {name} FAILED:\n{text[-1500:]}")
            manifest["programs"].append({"program": name, "compile_error": text[-1500:]})
            continue
        record = record_set_full if args.set_full else record_program
        entry = record(name, build / name, out, full, ncu)
        log(f"{name}: {json.dumps(entry, default=str)[:900]}")
        manifest["programs"].append(entry)

    def pack() -> None:  # written after each stage, so a run stopped by its time limit still returns data
        (stage / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str))
        with tarfile.open(dest / "fixtures.tar.gz", "w:gz") as tar:
            tar.add(stage, arcname="fixtures")

    pack()
    if not args.skip_extras and not args.set_full:
        for label, fn in (("torch", lambda: torch_end_to_end(out, full)),
                          ("perm_probe", lambda: perm_probe(ncu, build / "stream", full)),
                          ("cost", lambda: {"stream": cost_comparison(ncu, build / "stream")})):
            if time.perf_counter() - started > args.budget_s:
                log(f"{label}: skipped, over the time budget")
                continue
            try:
                manifest[label] = fn()
                log(f"{label}: {json.dumps(manifest[label], default=str)[:1500]}")
            except Exception as exc:  # noqa: BLE001 - keep what was recorded so far
                manifest[label] = {"error": repr(exc)}
                log(f"{label} FAILED: {exc!r}")
            pack()
    log(f"wrote {dest / 'fixtures.tar.gz'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
