"""Campaign progress in the terminal: one rich progress bar per problem and one overall, on stderr.

Without a terminal (CI logs, pipes) or with `--no-progress`, each update becomes one plain line.
"""

from __future__ import annotations

import sys
import threading
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn


class ConsoleProgress:
    """Context manager receiving `update(problem, done, total, message)` from a campaign."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.console = Console(stderr=True)
        self.bars = enabled and self.console.is_terminal
        self._progress: Progress | None = None
        self._tasks: dict[str, TaskID] = {}
        self._done: dict[str, tuple[int, int]] = {}
        self._overall: TaskID | None = None
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
        """Moves the bar of `problem` (creating it on first sight) and the overall bar."""
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

    def log(self, message: str) -> None:
        """A line above the bars (or on stderr)."""
        if self._progress is not None:
            self._progress.console.print(message)
        else:
            print(message, file=sys.stderr, flush=True)
