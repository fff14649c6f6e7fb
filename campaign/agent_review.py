"""Soft verification: an LLM review of a candidate against its reference for dropped functionality.

The harness already proves outputs match on several input sets and catches known cheats by
behaviour. The review looks for what tests on a handful of inputs can miss: a branch of the
reference that the test shapes never reach (a flag, a `bias=None` path, an odd size handled by
a tail loop), hard-coded shapes or constants, work silently skipped. It only ever removes a
candidate from acceptance; it never makes a rejected one pass.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kb_mcp.campaign.agent_base import PROBLEM_LINE
from kb_mcp.campaign.agent_parse import AnswerError, extract_json_object

REVIEW_SYSTEM = """
You are the code-review step of kb-mcp. A CUDA candidate (`ModelNew`) passed numerical tests
against its PyTorch reference (`Model`) on a few random inputs. Decide whether it implements the
SAME function for every input the reference accepts at the sizes its input generators produce, or
whether it drops functionality the tests could miss: an unhandled tail when sizes are not a multiple
of the block or tile size, hard-coded shapes or constants, a skipped parameter, bias, epsilon or
scaling factor, a missing branch, a reduction over the wrong axis that happens to agree on the
test shapes, or any shortcut that special-cases the test inputs.
Performance is not your concern; do not reject for style.
Answer with ONE JSON object in a ```json block:
{"verdict": "accept" | "reject", "issues": ["specific dropped functionality, with the line"], "summary": "one sentence"}
Reject only for a concrete issue you can name.
""".strip()


class ReviewAnswer(BaseModel):
    """The review's decision; `issues` name concrete dropped functionality when rejecting."""

    model_config = ConfigDict(extra="ignore")

    verdict: Literal["accept", "reject"]
    issues: list[str] = Field(default_factory=list)
    summary: str = ""

    @property
    def accepted(self) -> bool:
        """True when the reviewer found nothing missing."""
        return self.verdict == "accept"


def parse_review(text: str) -> ReviewAnswer:
    """Parses the reviewer's JSON; a reject without a named issue is sent back for one."""
    data = extract_json_object(text)
    if isinstance(data.get("verdict"), str):
        data["verdict"] = data["verdict"].strip().lower()
    try:
        answer = ReviewAnswer.model_validate(data)
    except ValidationError as exc:
        raise AnswerError(
            'The JSON must be {"verdict": "accept" or "reject", "issues": [...], "summary": "..."}; '
            f"got a problem with: {', '.join(str(e['loc'][0]) for e in exc.errors() if e['loc'])}."
        ) from exc
    if not answer.accepted and not [i for i in answer.issues if i.strip()]:
        raise AnswerError("A reject must name at least one concrete issue in `issues`; otherwise accept.")
    return answer


def review_request(problem_name: str, reference_source: str, candidate_source: str) -> str:
    """The single user message of a review."""
    return (
        f"{PROBLEM_LINE.format(name=problem_name)}\n\n"
        f"Reference:\n```python\n{reference_source.rstrip()}\n```\n\n"
        f"Candidate:\n```python\n{candidate_source.rstrip()}\n```\n\n"
        "Does the candidate implement the same function as the reference? Answer with the JSON object."
    )
