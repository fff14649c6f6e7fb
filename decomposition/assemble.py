"""The whole-model candidate composed from a decomposition's parts: for each part, the verdict a
composition takes in the KB (`KBView.composed_verdict`: a `faster` candidate checked with the default
options, never a flagged one, the largest speedup first; the rule is `kb.composition`'s), or the
reference part where it has none; written as an ordinary candidate
file (`composed.py`) an agent can read and edit, and verified end to end in composed mode by the caller
(`tools.decompose_problem`, `kb-mcp compose`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from kb_mcp.decomposition.compose import PartSource, composed_source
from kb_mcp.decomposition.decompose import COMPOSED, load
from kb_mcp.decomposition.models import Decomposition
from kb_mcp.harness.problem import content_hash
from kb_mcp.kb.view import KBView


class PartPick(BaseModel):
    """What the composed candidate took for one part, and why."""

    part: str  # part03
    label: str
    share: float
    taken: Literal["candidate", "reference"]
    candidate_id: str | None = None
    verdict: str | None = None
    speedup: float | None = Field(None, description="the part candidate's speedup over the better baseline")
    mode: str | None = None


class Composition(BaseModel):
    """A composed candidate: where it was written, and the part by part picks."""

    problem: str
    file: str
    picks: list[PartPick]

    @property
    def own_parts(self) -> int:
        """How many parts run a candidate of their own."""
        return sum(1 for p in self.picks if p.taken == "candidate")


def part_hash(parts_dir: Path, file: str) -> str:
    """The content hash of a part's problem file: the key of its verdicts in the KB."""
    return content_hash((parts_dir / file).read_text())


def compose_parts(parts_dir: Path, view: KBView, candidates_dir: Path,
                  chosen: dict[str, Path] | None = None) -> tuple[str, Composition]:
    """The composed candidate's text and picks. `chosen` names candidate files for parts (by part name)
    that win over the KB's verdicts (a campaign's own results, a test's kernel)."""
    decomp: Decomposition = load(parts_dir)
    sources, picks = [], []
    for part in decomp.parts:
        reference = (parts_dir / part.file).read_text()
        pick = PartPick(part=part.name, label=part.label, share=part.share, taken="reference")
        source, cls, note = reference, "Model", f"{part.label}: the reference part"
        given = (chosen or {}).get(part.name)
        best = None if given else view.composed_verdict(content_hash(reference))
        path = given or (candidates_dir / f"{best.candidate_id}.py" if best else None)
        if path is not None and path.is_file():
            source, cls = path.read_text(), "ModelNew"
            if best:
                pick = pick.model_copy(update={"taken": "candidate", "candidate_id": best.candidate_id,
                                               "verdict": best.verdict.value, "speedup": best.speedup_vs_baseline,
                                               "mode": best.mode})
                note = f"{part.label}: candidate {best.candidate_id} ({best.verdict.value}" + (
                    f", {best.speedup_vs_baseline:.2f}x)" if best.speedup_vs_baseline else ")")
            else:
                pick = pick.model_copy(update={"taken": "candidate"})
                note = f"{part.label}: {path.name}"
        sources.append(PartSource(name=part.name, source=source, class_name=cls, note=note))
        picks.append(pick)
    text = composed_source(decomp.problem, sources, decomp.glue)
    return text, Composition(problem=decomp.problem, file=str(parts_dir / COMPOSED), picks=picks)


def write_composed(parts_dir: Path, view: KBView, candidates_dir: Path,
                   chosen: dict[str, Path] | None = None) -> Composition:
    """Composes the candidate and writes it to `parts_dir/composed.py`."""
    text, composition = compose_parts(parts_dir, view, candidates_dir, chosen)
    (parts_dir / COMPOSED).write_text(text)
    return composition
