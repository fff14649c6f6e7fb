"""Campaign progress in the terminal: one rich progress bar per problem and one overall, on stderr
(an eval's ETA is the overall bar's message).

Without a terminal (CI logs, pipes) or with `--no-progress`, each update becomes one plain line.
"""

from __future__ import annotations

import sys
import threading
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from kb_mcp.campaign.eta import OVERALL


class ConsoleProgress:
    """Context manager receiving `update(problem, done, total, message)` from a campaign."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.console = Console(stderr=True)
        self.bars = enabled and self.console.is_terminal
        self._progress: Progress | None = None
        self._tasks: dict[str, TaskID] = {}
        self._done: dict[str, tuple[int, int]] = {}
        self._overall: TaskID | None = None
        self._whole_said = -1
        self._lock = threading.Lock()

    def __enter__(self) -> ConsoleProgress:
        if self.bars:
            self._progress = Progress(
                TextColumn("{task.fields[name]:<28}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[message]}"),
                console=self.console,
            )
            self._progress.start()
            self._overall = self._progress.add_task("all", total=0, name="[bold]all problems", message="")
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, problem: str, done: int, total: int, message: str) -> None:
        """Moves the bar of `problem` (creating it on first sight) and the overall bar; `OVERALL` (an
        eval's whole run) sets the overall bar's message (its ETA)."""
        if problem == OVERALL:
            self._whole(done, total, message)
            return
        with self._lock:
            self._done[problem] = (done, total)
            if self._progress is None:
                print(f"[{problem}] {done}/{total} {message}", file=sys.stderr, flush=True)
                return
            task = self._tasks.get(problem)
            if task is None:
                task = self._tasks[problem] = self._progress.add_task(problem, total=total, name=problem, message="")
            self._progress.update(task, completed=done, total=total, message=message[:60])
            assert self._overall is not None
            self._progress.update(
                self._overall,
                completed=sum(d for d, _ in self._done.values()),
                total=sum(t for _, t in self._done.values()),
            )

    def _whole(self, done: int, total: int, message: str) -> None:
        with self._lock:
            if self._progress is None:
                if done != self._whole_said:  # plain lines: once per finished problem, not per second
                    self._whole_said = done
                    print(f"[all problems] {done}/{total} verified; {message}", file=sys.stderr, flush=True)
                return
            assert self._overall is not None
            self._progress.update(self._overall, message=message[:80])

    def log(self, message: str) -> None:
        """A line above the bars (or on stderr)."""
        if self._progress is not None:
            self._progress.console.print(message)
        else:
            print(message, file=sys.stderr, flush=True)
