"""The baselines an eval times ahead (`campaign.evaluate`): those of its problems not cached yet for this GPU,
torch and track, timed on the GPU while a verification waits for its build ahead.

The first builds hide behind nothing: the GPU would wait for them. So while a verification waits for
its build ahead, the GPU times the baselines (eager and torch.compile) of the eval's problems that are
not cached yet (`BaselinesAhead`): the waiting problem's own first, then the next ones in order, one at
a time until the build is done. Each goes through `WorkerPool.baselines`, which holds the machine-wide
GPU lane and caches the figures exactly as a verification's own first measurement would (the same
request, in a worker no candidate ran in, with the same options and track), so the verification finds
them cached and its verdict is the one it would have reached measuring them itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kb_mcp.harness.baselines import BaselineCache, BaselineRun
from kb_mcp.harness.judgment.verdict import VerifyOptions
from kb_mcp.harness.problem import Problem

if TYPE_CHECKING:
    from kb_mcp.harness.pool.pool import WorkerPool

__all__ = ["BaselinesAhead", "Pending"]


@dataclass
class Pending:
    """A problem an eval will verify, for `BaselinesAhead`: its place in the eval's order, name, problem."""

    index: int
    name: str
    problem: Problem


class BaselinesAhead:
    """The baselines of an eval's problems not cached yet, timed on the GPU while a step waits for its
    build ahead (see the module docstring): the waiting problem's own first, then the next ones in the
    eval's order, never one whose verification has started. `pool.baselines` holds the GPU lane and
    caches what it measured alone, as a verification's own first measurement would."""

    def __init__(self, pool: WorkerPool, options: VerifyOptions, problems: list[Pending],
                 say: Callable[[int, str, str], None]) -> None:
        self.pool, self.options, self.say = pool, options, say
        info = pool.info()
        self.device, self.torch_version = info.device, info.torch_version
        self.left = [p for p in problems if not self.cached(p.problem)]
        self.timed: set[int] = set()  # problems (index) whose baselines this eval timed and cached
        self.seconds = 0.0  # GPU lane time spent on them

    def cached(self, problem: Problem) -> bool:
        """Whether a verification of `problem` would find its baselines in the pool's cache."""
        return BaselineCache(self.pool.cache_dir).get(
            problem.hash, self.device, self.torch_version, need_compile=self.options.compile_baseline,
            track=self.options.track.value) is not None

    def idle(self, index: int, name: str, report: Callable[[str], None]) -> Callable[[], bool]:
        """The piece of work `Pipeline.claim` gives the GPU while the build of problem `index` is not done."""
        return lambda: self.one(index, name, report)

    def one(self, index: int, name: str, report: Callable[[str], None]) -> bool:
        """Times the baselines of the next problem not cached, from the waiting one (`index`) on; False
        when none is left."""
        self.left = [q for q in self.left if q.index >= index]  # earlier ones were verified
        while self.left:
            q = self.left.pop(0)
            if self.cached(q.problem):  # cached meanwhile (another process verified it)
                continue
            report(f"its build is not done: the GPU times the baselines of {q.name} meanwhile")
            t0 = time.monotonic()
            try:
                run = self.pool.baselines(q.problem, self.options,
                                          lambda done, total=None, message=None: report(message or "baselines"))
            except RuntimeError as exc:  # no worker starts: the verifications report it
                self.say(q.index, q.name, f"no baselines ahead ({exc})")
                self.left.clear()
                return False
            seconds = time.monotonic() - t0
            self.seconds += seconds
            if self.cached(q.problem):
                self.timed.add(q.index)
            self.say(q.index, q.name, f"{_baselines_text(run)} in {seconds:.1f} s, timed ahead while {name}'s "
                     "build finished")
            return True
        return False


def _baselines_text(run: BaselineRun) -> str:
    """What a run of baselines ahead found, in a few words."""
    base = run.baseline
    if run.status == "ok" and base is not None:
        comp = f"{base.compile_ms:.3f} ms" if base.compile_ms is not None else "failed"
        return (f"baselines eager {base.eager_ms:.3f} ms, torch.compile {comp}"
                + ("" if not run.note else f" ({run.note[:160]})"))
    return f"baselines {run.status} ({run.note[:160]})"
