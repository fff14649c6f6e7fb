"""Which problems a run takes, and which solution file belongs to each: one place decides both.

Problems come from files, folders of problem files, a KernelBench level folder (`level1/`), or a
KernelBench checkout (a folder holding `level1/`, `level2/`, ... directly or under `KernelBench/`).
A KernelBench problem's id is its file name's number (`19_ReLU.py` is problem 19) and its level the
number of the `levelN` folder it sits in (in a folder not named so, the level given with `--level`).
`--level N` keeps one level, `--problems 1-20,40` the ids listed (files without an id number are
then left out).

A solution matches a problem by name, looked up in the solutions folder and in its `levelN`
subfolder: the problem's own file name (`19_ReLU.py`), else KernelBench's generated-kernel name
`level_<L>_problem_<N>_sample_<S>_kernel.py` (the lowest sample number).

Plain Python: paths and names only, nothing is imported or run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kb_mcp.kb.models import Mode

if TYPE_CHECKING:
    from kb_mcp.kb.errors import Fault

_ID = re.compile(r"^(\d+)_")
_LEVEL = re.compile(r"^level_?(\d+)$", re.IGNORECASE)
_SAMPLE = re.compile(r"^level_(\d+)_problem_(\d+)_sample_(\d+)_kernel\.py$")
MAX_IDS = 100_000  # an id range larger than any benchmark: a typo, not a selection


class SelectionError(ValueError):
    """The problem selection cannot be satisfied; the message says what was given and what exists,
    `whose` whether the paths given (the caller's) or an option no run could use ("usage")."""

    def __init__(self, message: str, *, whose: Fault = "caller") -> None:
        super().__init__(message)
        self.whose: Fault = whose


@dataclass(frozen=True)
class ProblemRef:
    """One selected problem file, with its KernelBench level and id where the path says them."""

    path: Path
    level: int | None
    id: int | None

    @property
    def name(self) -> str:
        """The problem's name in a run: its file name without `.py`."""
        return self.path.stem


def parse_ids(text: str) -> set[int]:
    """'1-20,40' -> {1, ..., 20, 40}."""
    ids: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        match = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if match is None:
            raise SelectionError(f"--problems expects ids and ranges like 1-20,40; got {part!r}", whose="usage")
        lo = int(match.group(1))
        hi = int(match.group(2) or lo)
        if hi < lo:
            raise SelectionError(f"--problems: the range {part!r} runs backwards", whose="usage")
        if hi - lo >= MAX_IDS:
            raise SelectionError(f"--problems: the range {part!r} is too large", whose="usage")
        ids.update(range(lo, hi + 1))
    if not ids:
        raise SelectionError("--problems is empty; give ids and ranges like 1-20,40", whose="usage")
    return ids


def problem_id(path: Path) -> int | None:
    """KernelBench's problem id: the number a file name starts with ('19_ReLU.py' -> 19)."""
    match = _ID.match(path.name)
    return int(match.group(1)) if match else None


def eval_mode(level: int | None, given: str | None = None) -> Mode:
    """The verification mode of a problem in an eval: the one given (`--mode`), else composed for a
    level-3 model (its layers stay PyTorch where no kernel of the candidate's replaces them) and own
    kernels for every other level (docs/harness.md, "Composed mode")."""
    if given is not None:
        return "composed" if given == "composed" else "own"
    return "composed" if level == 3 else "own"


def folder_level(folder: Path) -> int | None:
    """The level a folder named `levelN` (or `level_N`) holds."""
    match = _LEVEL.match(folder.name)
    return int(match.group(1)) if match else None


def _level_dirs(root: Path) -> dict[int, Path]:
    found: dict[int, Path] = {}
    for base in (root, root / "KernelBench"):
        if base.is_dir():
            for child in sorted(base.iterdir()):
                level = folder_level(child)
                if child.is_dir() and level is not None:
                    found.setdefault(level, child)
    return found


def _problem_files(folder: Path) -> list[Path]:
    files = [p for p in folder.glob("*.py") if not p.name.startswith("_")]
    return sorted(files, key=lambda p: (problem_id(p) is None, problem_id(p) or 0, p.name))


def _expand(entry: Path, level: int | None) -> list[ProblemRef]:
    if entry.is_file():
        return [ProblemRef(entry, _own_level(entry.parent, level), problem_id(entry))]
    if not entry.is_dir():
        raise SelectionError(f"problem path not found: {entry}")
    levels = _level_dirs(entry)
    if levels:  # a KernelBench checkout
        if level is not None and level not in levels:
            raise SelectionError(f"{entry} has no level{level} folder (it has level {', '.join(map(str, levels))})")
        chosen = [levels[level]] if level is not None else [levels[k] for k in sorted(levels)]
        return [ProblemRef(p, folder_level(d), problem_id(p)) for d in chosen for p in _problem_files(d)]
    own = _own_level(entry, level)
    return [ProblemRef(p, own, problem_id(p)) for p in _problem_files(entry)]


def _own_level(folder: Path, given: int | None) -> int | None:
    """A `levelN` folder's level; a folder not named so takes the level the user gave (--level)."""
    level = folder_level(folder)
    return level if level is not None else given


def select_problems(paths: list[str | Path], *, level: int | None = None, ids: str | None = None) -> list[ProblemRef]:
    """The problems named by `paths` (files, folders, KernelBench checkouts), filtered by level and ids.

    A level filter keeps problems whose level is known and equal; an id filter keeps problems whose
    id is listed. Raises SelectionError when nothing is left, naming what was there.
    """
    refs: list[ProblemRef] = []
    for entry in paths:
        refs += _expand(Path(entry).expanduser().resolve(), level)
    found = len(refs)
    if level is not None:
        refs = [r for r in refs if r.level == level]
    if ids is not None:
        wanted = parse_ids(ids)
        refs = [r for r in refs if r.id in wanted]
    if not refs:
        what = " and ".join(f for f in (f"level {level}" if level is not None else "",
                                         f"ids {ids}" if ids is not None else "") if f)
        raise SelectionError(f"no problem files selected from {', '.join(map(str, paths)) or '(nothing)'}"
                             + (f" ({found} found, none with {what})" if what else ""))
    names = [r.name for r in refs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SelectionError(f"two problems share a file name ({', '.join(dupes)}); select one level (--level)")
    return refs


def match_solution(problem: ProblemRef, solutions: Path) -> Path | None:
    """The solution file for `problem` in `solutions` (see the module docstring), or None."""
    folders = [solutions]
    if problem.level is not None:
        folders += [solutions / f"level{problem.level}", solutions / f"level_{problem.level}"]
    for folder in folders:
        same = folder / problem.path.name
        if same.is_file():
            return same
    if problem.id is None or problem.level is None:
        return None
    samples: list[tuple[int, Path]] = []
    for folder in folders:
        if not folder.is_dir():
            continue
        for f in folder.glob(f"level_{problem.level}_problem_{problem.id}_sample_*_kernel.py"):
            match = _SAMPLE.match(f.name)
            if match and int(match.group(1)) == problem.level and int(match.group(2)) == problem.id:
                samples.append((int(match.group(3)), f))
    return min(samples)[1] if samples else None
