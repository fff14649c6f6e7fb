"""The doctor's checks of the sandbox untrusted code runs in (`harness.sandbox`): whether one can be
built on this machine, and whether what a candidate tries in it can be recorded."""

from __future__ import annotations

import os
import shutil
import sys

from kb_mcp.server.doctor_model import Check, Status

__all__ = ["check_attempts", "check_sandbox"]


def check_sandbox() -> Check:
    """The harness's sandbox (bubblewrap), as `harness.sandbox.sandbox.detect` finds it on this machine."""
    from kb_mcp.harness.sandbox.sandbox import SandboxUnavailable, detect

    try:
        sandbox = detect()
    except SandboxUnavailable as exc:
        why = str(exc).partition(". To run")[0].removeprefix("untrusted code is not run: ")
        return Check(name="sandbox", status=Status.fail, summary=f"no sandbox: {why}",
                     fix="set up what the line above names; or set KB_MCP_SANDBOX=unconfined to run candidates "
                     "without confinement (they can then read and change what this user can; every verdict is flagged)")
    if not sandbox.confined:
        return Check(name="sandbox", status=Status.warn, summary=sandbox.describe(),
                     fix="unset KB_MCP_SANDBOX to confine candidates with bubblewrap")
    # docs/harness.md: as root the kernel does not count processes (RLIMIT_NPROC); the pid namespace holds
    as_root = "; as root: no process-count limit, the pid namespace contains them" if os.geteuid() == 0 else ""
    return Check(name="sandbox", status=Status.ok, summary=sandbox.describe() + as_root)


# A connection the sandbox's network namespace cannot make (TEST-NET-1): recorded where the watch works.
_PROBE_ATTEMPT = ("import socket\ns = socket.socket()\ns.settimeout(1)\n"
                  "try:\n    s.connect(('192.0.2.1', 9))\nexcept OSError:\n    pass\n")
_ATTEMPT_FIXES = {
    "KB_MCP_WATCH=off": "unset KB_MCP_WATCH to record what candidates try",
    "libseccomp": "install libseccomp (e.g. apt-get install libseccomp2)",
    "kernel": "run on Linux 5.5 or newer outside gVisor (seccomp user notification with CONTINUE)",
    "unconfined": "unset KB_MCP_SANDBOX: attempts are recorded only in the bubblewrap sandbox",
}


def check_attempts() -> Check:
    """Whether what a candidate tries in the sandbox can be recorded here (`harness.sandbox.watch`): one real
    attempt made in the sandbox, and whether the server's record saw it; else why not."""
    import time

    from kb_mcp.harness.sandbox.attempts import collecting
    from kb_mcp.harness.sandbox.sandbox import Grant, SandboxUnavailable, detect
    from kb_mcp.harness.sandbox.scratch import new_scratch

    try:
        sandbox = detect()
    except SandboxUnavailable:
        return Check(name="attempts", status=Status.info, summary="not recorded: no sandbox (see the line above)")
    why = sandbox.watch_unavailable()
    if not why:
        scratch = new_scratch("doctor")
        try:
            with collecting() as seen:
                code, out = sandbox.run([sys.executable, "-c", _PROBE_ATTEMPT], Grant(role="tool", scratch=scratch),
                                        timeout_s=60)
            for _ in range(20):  # the watch's thread may still be saying why it has no record
                if seen.attempts or seen.unrecorded:
                    break
                time.sleep(0.1)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if any(a.kind == "network" and "192.0.2.1" in a.what for a in seen.attempts):
            return Check(name="attempts", status=Status.ok,
                         summary="recorded: a test connection from the sandbox was seen by the server's watch")
        why = "; ".join(sorted(seen.unrecorded)) or \
            f"the test attempt left no record (exit {code}: {out.strip()[-200:]})"
    fix = next((f for key, f in _ATTEMPT_FIXES.items() if key in why),
               "see docs/harness.md (What a candidate tried): candidates stay confined, their attempts go unreported")
    return Check(name="attempts", status=Status.warn, summary=f"not recorded: {why}", fix=fix)
