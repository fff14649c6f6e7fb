"""A server's first profile, warm: a profiling driver started in the background as the server starts.

After each profile the profiler starts the next driver in standby (`profiling.profile_standby`), but
a server's first profile found none and paid the driver's start-up (Python, torch, the CUDA
context under ncu: about 7.5 of its ~10 s). So `kb-mcp serve`, on a machine with a GPU, starts one
standby for the options of a request that sets none (`profile_kernel.prewarm`), in a thread: the
server answers its client meanwhile, and a failure is logged and costs only that warm start. The
launch and the driver's start-up hold the GPU lane, so a timing of this server or of another
kb-mcp process on the GPU waits for them instead of running beside a new CUDA context.
`KB_MCP_PROFILE_STANDBY=0` turns it off with the other standbys; a context made without them
(`kb-mcp call`) starts none.

What is logged (logger `kb_mcp.server.prewarm`, INFO): that a driver is warming, and when it is
ready (the first profile then pays only for its own work) or why none was started.
"""

from __future__ import annotations

import logging
import threading
import time

from kb_mcp.harness.gpu.gpu_probe import no_gpu_reason
from kb_mcp.profiling.profile_standby import ENV_STANDBY, Standby, standby_enabled
from kb_mcp.profiling.profiler import find_ncu
from kb_mcp.server.gpu import detect_gpus
from kb_mcp.tools.context import ToolContext
from kb_mcp.tools.profile_kernel import prewarm

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 180.0  # a cold machine's first `import torch` can take a minute; ready is only logged


def warm_profiler(ctx: ToolContext) -> threading.Thread | None:
    """Starts the warm-up thread (returned, so that a caller may wait for it); None where no driver
    is to be warmed: the context keeps no standby, or standby is turned off."""
    if not ctx.standby_profiler:
        return None
    if not standby_enabled():
        log.info("profiling drivers are not started ahead of profiles (%s=0): each profile starts cold", ENV_STANDBY)
        return None
    thread = threading.Thread(target=_warm_if_gpu, args=(ctx,), name="kb-mcp-profiler-warmup", daemon=True)
    thread.start()
    return thread


def _warm_if_gpu(ctx: ToolContext) -> None:
    # nvidia-smi runs in this thread, so a slow driver never delays the server; the probe is what
    # profile_kernel asks too (a GPU hidden by CUDA_VISIBLE_DEVICES would only say needs_gpu).
    hidden = no_gpu_reason()
    if hidden is not None or not detect_gpus():
        log.info("no GPU found (%s): no profiling driver is started ahead of profile_kernel",
                 hidden or "nvidia-smi lists none")
        return
    warm(ctx)


def warm(ctx: ToolContext, ready_timeout_s: float = READY_TIMEOUT_S) -> float | None:
    """Starts a profiling driver in standby and waits until it is ready, logging both; returns the
    seconds it took to get ready, None when none was started or it did not get ready."""
    started = time.monotonic()
    log.info("warming a profiling driver in the background so that the first profile_kernel finds it started "
             "(%s=0 turns this off)", ENV_STANDBY)
    try:
        standby = prewarm(ctx)
    except Exception as exc:  # never the server's end: the first profile simply runs cold
        log.warning("could not start a profiling driver ahead of the first profile (it will start cold): %s", exc,
                    exc_info=log.isEnabledFor(logging.DEBUG))
        return None
    if standby is None:
        log.info("no profiling driver warmed (%s): the first profile starts its own", _why_none(ctx))
        return None
    return _wait_ready(standby, started, ready_timeout_s)


def _why_none(ctx: ToolContext) -> str:
    pool = ctx.profilers
    if pool is None:
        return "the server is stopping"
    if pool.disabled_reason:
        return pool.disabled_reason
    if pool.waiting is not None:
        return "one started by a profile is waiting already"
    if find_ncu() is None:
        return "no Nsight Compute (ncu) found: profiles give timings only"
    return f"standby turned off ({ENV_STANDBY}=0)"


def _wait_ready(standby: Standby, started: float, timeout_s: float) -> float | None:
    deadline = started + timeout_s
    while time.monotonic() < deadline:
        if standby.ready():
            took = time.monotonic() - started
            log.info("profiling driver ready %.1f s after the server started: the first profile_kernel will use it",
                     took)
            return took
        if not standby.process.alive():
            # Handed a profile before its start-up ended (that profile waited for the rest), or it failed.
            log.info("the warming profiling driver ended before it was ready (taken by an early profile, or its "
                     "start-up failed: that profile then ran cold)")
            return None
        time.sleep(0.1)
    log.warning("the warming profiling driver was not ready within %.0f s; a profile still uses it once it is",
                timeout_s)
    return None
