"""The scripted model behind the campaign tests, for the example problems `swish` and
`elementwise_chain_small`.

It answers like a fallible model: a refusal and a prose-only answer before the first swish
kernel, code that does not compile (then its fix once the compiler's message comes back, or for
the chain the same error again), a variant with uncoalesced access that the review rejects (and that
the model insists on when told), and
textual-gradient answers that mix valid and invalid KB edits. All kernels are real CUDA (NVRTC style) in `answers/`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from fakellm.server import Answer, Rule, Script

ANSWERS = Path(__file__).resolve().parent / "answers"
SWISH = "swish"
CHAIN = "elementwise_chain_small"


def kernel(name: str, prose: str = "Here is the implementation.") -> str:
    """A fenced answer holding `answers/<name>.py`."""
    return f"{prose}\n\n```python\n{(ANSWERS / f'{name}.py').read_text()}```\n"


def _json_block(value: Any) -> str:
    return "```json\n" + json.dumps(value, indent=1) + "\n```"


def _blocks(messages: list[dict[str, Any]]) -> list[Any]:
    text = messages[-1]["content"]
    return [json.loads(b) for b in re.findall(r"```json\n(.*?)\n```", text, re.S)]


def review(messages: list[dict[str, Any]]) -> str:
    """Rejects the chunked swish (its tail handling is fine, but the script wants one rejection)."""
    candidate = messages[-1]["content"].split("Candidate:", 1)[-1]
    if "swish_chunks" in candidate:
        return _json_block(
            {"verdict": "reject", "issues": ["each thread walks a private chunk: the last partial chunk is "
                                             "skipped when n is not a multiple of threads*chunk"]}
        )
    return 'Looks equivalent.\n' + _json_block({"verdict": "accept", "issues": [], "summary": "same function"})


def evaluate(messages: list[dict[str, Any]]) -> str:
    """Judges each (state, optimization) row: overestimated unless a valid outcome was faster."""
    rows = _blocks(messages)[0]
    items = [
        {
            "state_id": r["state_id"],
            "optimization_id": r["optimization_id"],
            "assessment": "accurate" if r["faster"] else "overestimated",
            "comment": f"{r['outcomes']} outcomes, {r['compile_errors']} did not compile",
        }
        for r in rows
    ]
    return _json_block({"summary": f"{len(rows)} predictions judged", "items": items})


def analyze(messages: list[dict[str, Any]]) -> str:
    """One gap per evaluated row."""
    evaluation = _blocks(messages)[0]
    gaps = [
        {"state_id": i["state_id"], "optimization_id": i["optimization_id"],
         "cause": "first attempts often fail to compile; gains depend on the access pattern",
         "evidence": i["comment"], "suggestion": "lower the prior until measured"}
        for i in evaluation["items"]
    ]
    return _json_block({"summary": "compile failures dominate", "gaps": gaps})


def update(messages: list[dict[str, Any]]) -> str:
    """A lesson and a prior move on the first batch pair (valid), plus two invalid edits."""
    excerpt = _blocks(messages)[1]
    pair = excerpt["batch_scores"][0]
    state_id, opt_id = pair["state_id"], pair["optimization_id"]
    edits = [
        {"kind": "add_lesson", "state_id": state_id, "optimization_id": opt_id,
         "text": f"In {state_id}, {opt_id} failed to compile on the first try in {pair['attempts']} recorded "
                 "attempts: ask for the complete kernel and check every statement ends with a semicolon.",
         "reason": "compile errors in this batch"},
        {"kind": "adjust_prior", "state_id": state_id, "optimization_id": opt_id,
         "expected_speedup": round(max(0.3, 0.7 * (pair["expected_speedup"] or 1.0)), 3),
         "weight": 1.5, "reason": "prediction was too optimistic for this batch"},
        {"kind": "add_lesson", "state_id": "state_that_does_not_exist", "optimization_id": opt_id,
         "text": "This lesson names a state the KB does not have and must be rejected.",
         "reason": "invalid on purpose"},
        {"kind": "deprecate_everything", "reason": "not an edit kind at all"},
    ]
    return "Proposed edits:\n" + _json_block({"edits": edits, "summary": "one lesson, one prior"})


def campaign_script() -> Script:
    """Rules for every role of a campaign over swish and elementwise_chain_small."""
    return Script(
        rules=[
            # first kernels: swish after a refusal and a prose-only answer; chain after a compile fix
            Rule(role="generate", problem=SWISH, answers=[
                Answer(text="I'm sorry, but I can't help with writing GPU kernels."),
                Answer(text="A fused kernel computing x * sigmoid(x) with one thread per element would work well."),
                Answer(text=kernel("swish_v1")),
            ]),
            Rule(role="generate", problem=CHAIN, contains="verdict: compile_error",
                 answers=[Answer(text=kernel("chain_v1"))]),
            Rule(role="generate", problem=CHAIN, answers=[Answer(text=kernel("chain_broken"))]),
            # lowering: swish gets a broken vectorization (fixed after the compiler's message), then variants
            Rule(role="lower", problem=SWISH, contains="verdict: compile_error",
                 answers=[Answer(text=kernel("swish_vec4"))]),
            Rule(role="lower", problem=SWISH, contains="code review rejected",
                 answers=[Answer(text=kernel("swish_strided", "The chunked version is correct as it is:"))]),
            Rule(role="lower", problem=SWISH, cycle=True, answers=[
                Answer(text=kernel("swish_broken", "Vectorized with float4:")),
                Answer(text=kernel("swish_strided", "Each thread now handles a chunk:")),
                Answer(text=kernel("swish_vec4")),
                Answer(text=kernel("swish_b512", "Larger blocks:")),
            ]),
            # chain: smaller blocks, then a fusion attempt that never compiles (a compile failure for the KB)
            Rule(role="lower", problem=CHAIN, contains="verdict: compile_error",
                 answers=[Answer(text=kernel("chain_broken"))]),
            Rule(role="lower", problem=CHAIN, cycle=True, answers=[
                Answer(text=kernel("chain_small_blocks", "Smaller blocks for more parallelism:")),
                Answer(text=kernel("chain_broken")),
                Answer(text=kernel("chain_b128")),
                Answer(text=kernel("chain_v1")),
            ]),
            Rule(role="review", responder=review),
            Rule(role="evaluate", responder=evaluate),
            Rule(role="analyze", responder=analyze),
            Rule(role="update", responder=update),
        ]
    )
