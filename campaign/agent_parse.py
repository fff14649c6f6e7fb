"""Reading LLM answers: code out of fences or prose, JSON out of chatter, refusals recognised.

Models wrap answers in Markdown fences, add explanations before and after, truncate long
answers, or decline. These helpers turn such text into something a typed parser can check,
and raise `AnswerError` with a message that can be sent back to the model as a correction.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from kb_mcp.kb import pyparse

_FENCE_RE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_REFUSAL_RE = re.compile(
    r"\b(I\s*(?:am|'m)\s+(?:sorry|unable|not able)|I\s+(?:can(?:no|')t|cannot|won't|will not)\s+"
    r"(?:help|assist|do|provide|write|comply)|as an ai\b|I must decline)",
    re.IGNORECASE,
)
_CODE_LANGS = {"", "python", "py", "python3"}


class AnswerError(ValueError):
    """An answer that cannot be used; `feedback` is what to tell the model so it can answer again."""

    def __init__(self, feedback: str, *, refusal: bool = False) -> None:
        super().__init__(feedback)
        self.feedback = feedback
        self.refusal = refusal


def looks_like_refusal(text: str) -> bool:
    """True for a short answer without code that declines the task."""
    if "```" in text or "class ModelNew" in text:
        return False
    return bool(_REFUSAL_RE.search(text[:600]))


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block, in order; an unclosed last fence runs to the end."""
    return [(m.group(1).lower(), m.group(2)) for m in _FENCE_RE.finditer(text)]


def extract_module(text: str, required_class: str = "ModelNew") -> str:
    """The Python module in `text` that defines `required_class`, syntax-checked.

    Prefers the last fenced Python block defining the class (models often revise themselves),
    then unfenced text starting at its first import. Raises AnswerError saying what was wrong.
    """
    if not text.strip():
        raise AnswerError("The answer was empty. Reply with the complete Python module in one ```python block.")
    candidates = [body for lang,
                  body in fenced_blocks(text) if lang in _CODE_LANGS and f"class {required_class}" in body]
    if not candidates and "```" not in text and f"class {required_class}" in text:
        start = re.search(r"^(?:import |from |#)", text, re.MULTILINE)
        candidates = [text[start.start() :] if start else text]
    if not candidates:
        if looks_like_refusal(text):
            raise AnswerError(
                "The answer declined the task. This is a performance-engineering task on your own code: "
                f"write the CUDA implementation and reply with the complete module defining `class {required_class}` "
                "in one ```python block.",
                refusal=True,
            )
        raise AnswerError(
            f"No Python module defining `class {required_class}` was found in the answer. Reply with the complete "
            "module (imports, CUDA source strings, kernel loading and the class) in one ```python block."
        )
    source = candidates[-1].strip("\n") + "\n"
    try:
        tree = pyparse.parse(source)
    except SyntaxError as exc:
        raise AnswerError(
            f"The module has a Python syntax error at line {exc.lineno}: {exc.msg}. "
            "Reply with the complete, corrected module in one ```python block."
        ) from exc
    if not any(isinstance(node, ast.ClassDef) and node.name == required_class for node in tree.body):
        raise AnswerError(f"`class {required_class}` must be defined at the top level of the module.")
    return source


def extract_json_object(text: str) -> dict[str, Any]:
    """The first JSON object in `text`: a ```json block, else the first balanced {...} that parses."""
    for lang, body in fenced_blocks(text):
        if lang in ("json", "") and body.strip().startswith("{"):
            try:
                value = json.loads(body)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    if looks_like_refusal(text):
        raise AnswerError("The answer declined the task. Reply with the JSON object asked for.", refusal=True)
    raise AnswerError("No JSON object was found in the answer. Reply with exactly one JSON object in a ```json block.")
