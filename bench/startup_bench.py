"""Start-up time of the `kb-mcp` command: wall time of each command, median of several runs,
beside a bare `python -c pass` measured in the same run, and the CPU time (user + system) the
command's process used, which other work on a shared machine inflates much less than wall time.

    python bench/startup_bench.py [--runs 9]

Each command runs as a user runs it (the installed console script, a fresh process each time) on
a seeded KB in a temporary folder. Figures go to docs/benchmarks.md with the machine and date.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = (
    ["--help"],
    ["--version"],
    ["kb", "--help"],
    ["kb", "stats"],
    ["kb", "stats", "--json"],
    ["kb", "states"],
    ["kb", "candidates"],
    ["doctor", "--json"],
    ["call", "--list"],
)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _time(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of `argv`."""
    cpu, start = _cpu(), time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, check=False)
    took, used = time.perf_counter() - start, _cpu() - cpu
    if done.returncode not in (0, 1):  # doctor exits 1 where a check fails: still a fair timing
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode()[-500:]}")
    return took, used


def main() -> int:
    """Prints a table of median wall times."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9, help="runs per command (default 9)")
    args = parser.parse_args()
    exe = shutil.which("kb-mcp", path=str(Path(sys.executable).parent)) or shutil.which("kb-mcp")
    if exe is None:
        raise SystemExit("kb-mcp is not installed in this environment (pip install -e .)")
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "KB_MCP_KB": str(Path(tmp) / "kb.json"), "KB_MCP_CACHE": str(Path(tmp) / "cache")}
        subprocess.run([exe, "kb", "init"], check=True, stdout=subprocess.DEVNULL, env=env)
        rows = [("python -c pass", [sys.executable, "-c", "pass"])] + [
            ("kb-mcp " + " ".join(c), [exe, *c]) for c in COMMANDS
        ]
        for _name, argv in rows:  # warm the file cache once
            _time(argv, env)
        results = []
        for name, argv in rows:
            runs = [_time(argv, env) for _ in range(args.runs)]
            walls, cpus = [w for w, _ in runs], [c for _, c in runs]
            results.append((name, statistics.median(walls), min(walls), max(walls), statistics.median(cpus)))
    base = results[0][1]
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f}; median of {args.runs} runs")
    print(f"{'command':32} {'wall s':>7} {'min s':>7} {'max s':>7} {'x python':>9} {'CPU s':>7}")
    for name, median, low, high, cpu in results:
        print(f"{name:32} {median:7.3f} {low:7.3f} {high:7.3f} {median / base:9.1f} {cpu:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
