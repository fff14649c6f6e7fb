"""What a kernel launch costs under each part of the sandbox, on a GPU.

    source .whl/prelude.sh && python3 bench/sandbox_launch_probe.py [--rounds 2] [--out results.json]

Each condition starts a fresh interpreter that launches `x + 1.0` (one small kernel) 1,000 times per
series, 7 series after a warm-up, and reports the median microseconds per launch (wall time of the
series, synchronized at its end), with the cost of one `getpid()` system call beside it. The
conditions add the sandbox's parts one at a time, from a bare process to `Sandbox.popen` as the
verify worker gets it, so the cost the timing-fidelity figures show per launch
(`bench/timing_fidelity.py --sandbox both`) can be pinned on the part that causes it. Conditions
alternate over `--rounds` rounds so that drift of the machine shows as a spread, not as a cause.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SNIPPET = r"""
import json, os, time, statistics, resource
import torch
x = torch.ones(1024, device="cuda")
for _ in range(300):
    y = x + 1.0
torch.cuda.synchronize()
per = []
for _ in range(7):
    t = time.perf_counter()
    for _ in range(1000):
        y = x + 1.0
    torch.cuda.synchronize()
    per.append((time.perf_counter() - t) * 1e6 / 1000)
t = time.perf_counter_ns()
for _ in range(100000):
    os.getpid()
pid_ns = (time.perf_counter_ns() - t) / 100000
status = open("/proc/self/status").read()
ssb = [line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith("Speculation_Store_Bypass")]
print(json.dumps({"us_per_launch": statistics.median(per), "spread": [min(per), max(per)], "getpid_ns": pid_ns,
                  "uid": os.getuid(), "ssb": ssb[0] if ssb else "?", "cpus": len(os.sched_getaffinity(0)),
                  "rlimit_data": resource.getrlimit(resource.RLIMIT_DATA)[0]}))
"""


def _bwrap_base(bwrap: str) -> list[str]:
    # The whole file system as it is, GPU nodes included: only the flags under test differ.
    return [bwrap, "--bind", "/", "/", "--dev-bind", "/dev", "/dev"]


def _conditions(scratch: Path) -> list[tuple[str, Any]]:
    """(label, how to start the snippet) per condition, in the order they add parts of the sandbox."""
    from kb_mcp.harness.sandbox.sandbox import Grant, Sandbox, bwrap_path

    bwrap = bwrap_path()
    py = [sys.executable, "-c", SNIPPET]
    conds: list[tuple[str, Any]] = [("bare", py)]
    if shutil.which("setarch"):  # address-space layout randomization off: alignment effects per process
        conds.append(("bare, ASLR off (setarch -R)", ["setarch", os.uname().machine, "-R", *py]))
    if shutil.which("taskset"):  # one core: placement effects per process
        conds.append(("bare, pinned to one core (taskset -c 3)", ["taskset", "-c", "3", *py]))
    if shutil.which("setpriv"):
        conds.append(("bare as uid 65534 (setpriv)", ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                                       *py]))
    if bwrap:
        base = _bwrap_base(bwrap)
        conds += [
            ("bwrap: mount namespace only", [*base, "--", *py]),
            ("+ --unshare-user", [*base, "--unshare-user", "--", *py]),
            ("+ --unshare-user --uid 65534", [*base, "--unshare-user", "--uid", "65534", "--gid", "65534", "--", *py]),
            ("+ --unshare-pid", [*base, "--unshare-pid", "--", *py]),
            ("+ --unshare-net", [*base, "--unshare-net", "--", *py]),
            ("+ --unshare-ipc --unshare-uts --unshare-cgroup", [*base, "--unshare-ipc", "--unshare-uts",
                                                                "--unshare-cgroup-try", "--", *py]),
            ("+ --new-session --die-with-parent", [*base, "--new-session", "--die-with-parent", "--", *py]),
            ("+ --unshare-all --unshare-user --uid 65534", [*base, "--unshare-all", "--unshare-user", "--uid",
                                                            "65534", "--gid", "65534", "--", *py]),
        ]
        sandbox = Sandbox("bwrap", bwrap)
        grant = Grant(role="worker", scratch=scratch, gpu=True)
        conds.append(("Sandbox.popen (worker: view, seccomp, limits)", ("popen", sandbox, grant)))
    conds.append(("unconfined Sandbox.popen (limits only)", ("popen", Sandbox("unconfined"), Grant(
        role="worker", scratch=scratch, gpu=True))))
    return conds


def _run(how: Any) -> dict[str, Any]:
    if isinstance(how, tuple):
        _, sandbox, grant = how
        proc = sandbox.popen([sys.executable, "-c", SNIPPET], grant, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        out, err = proc.communicate(timeout=300)
        code = proc.returncode
    else:
        done = subprocess.run(how, capture_output=True, text=True, timeout=300)
        out, err, code = done.stdout, done.stderr, done.returncode
    if code != 0:
        return {"error": ((err or out).strip().splitlines() or ["no output"])[-1][-300:]}
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", help="JSON file for the raw results")
    parser.add_argument("--only", action="append", default=[],
                        help="run only the conditions whose label contains this text (repeatable; bare always runs)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="kbmcp-launch-probe-"))
    os.chmod(scratch, 0o777)
    conds = [(label, how) for label, how in _conditions(scratch)
             if label == "bare" or not args.only or any(text in label for text in args.only)]
    print(f"date: {time.strftime('%Y-%m-%d %H:%MZ', time.gmtime())}  conditions: {len(conds)}  rounds: {args.rounds}",
          flush=True)
    results: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in conds}
    for r in range(args.rounds):
        for label, how in conds:
            res = _run(how)
            results[label].append(res)
            shown = res.get("error") or (
                f"{res['us_per_launch']:.2f} us/launch (series {res['spread'][0]:.2f}-{res['spread'][1]:.2f}), "
                f"getpid {res['getpid_ns']:.0f} ns, uid {res['uid']}, ssb {res['ssb']!r}, cpus {res['cpus']}")
            print(f"[round {r + 1}] {label:52s} {shown}", flush=True)
    print(f"\n{'condition':52s} {'us/launch':>10s} {'vs bare':>8s} {'getpid ns':>10s}")
    bare = [x["us_per_launch"] for x in results["bare"] if "us_per_launch" in x]
    bare_us = statistics.median(bare) if bare else float("nan")
    for label, runs in results.items():
        ok = [x for x in runs if "us_per_launch" in x]
        if not ok:
            print(f"{label:52s} {'failed':>10s}")
            continue
        us = statistics.median(x["us_per_launch"] for x in ok)
        ns = statistics.median(x["getpid_ns"] for x in ok)
        print(f"{label:52s} {us:10.2f} {us / bare_us:8.2f} {ns:10.0f}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
