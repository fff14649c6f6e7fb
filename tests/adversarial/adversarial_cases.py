"""The adversarial table (expectations.toml) as typed cases, shared by the CPU and GPU tests."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PROBLEMS = ROOT / "examples" / "problems"


@dataclass(frozen=True)
class Case:
    """One adversarial candidate and what the harness must conclude about it."""

    file: str
    problem: str
    exploit: str
    verdicts: tuple[str, ...]
    codes_any: tuple[str, ...] = ()
    static: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()
    honest: bool = False
    min_speedup_vs_eager: float | None = None
    mode: str = "own"  # the verification mode (composed: the reference's own ops may stay)
    min_coverage: float | None = None  # bounds on the share of its GPU time in its own kernels
    max_coverage: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return ROOT / self.file if self.file.startswith("examples/") else HERE / self.file

    @property
    def problem_path(self) -> Path:
        """An example problem (`examples/problems/<name>.py`), or one of this suite's own (`problems/<name>`)."""
        return HERE / f"{self.problem}.py" if self.problem.startswith("problems/") else PROBLEMS / f"{self.problem}.py"

    @property
    def id(self) -> str:
        return Path(self.file).stem


def load_cases() -> list[Case]:
    """Every case of expectations.toml, in file order."""
    data = tomllib.loads((HERE / "expectations.toml").read_text())
    cases = []
    for raw in data["case"]:
        raw = dict(raw)
        cases.append(
            Case(
                file=raw.pop("file"),
                problem=raw.pop("problem"),
                exploit=raw.pop("exploit"),
                verdicts=tuple(raw.pop("verdicts")),
                codes_any=tuple(raw.pop("codes_any", ())),
                static=tuple(raw.pop("static", ())),
                allow=tuple(raw.pop("allow", ())),
                honest=bool(raw.pop("honest", False)),
                min_speedup_vs_eager=raw.pop("min_speedup_vs_eager", None),
                mode=raw.pop("mode", "own"),
                min_coverage=raw.pop("min_coverage", None),
                max_coverage=raw.pop("max_coverage", None),
                extra=raw,
            )
        )
    return cases


CASES = load_cases()
CHEATS = [c for c in CASES if not c.honest]
HONEST = [c for c in CASES if c.honest]
