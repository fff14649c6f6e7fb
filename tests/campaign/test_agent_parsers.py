"""Typed parsers of agent answers: fenced code, prose, truncation, refusals, JSON in chatter."""

from __future__ import annotations

import pytest
from fakellm import Answer, Rule, Script

from kb_mcp.campaign.agent_base import AgentFailed, Conversation
from kb_mcp.campaign.agent_gradient import parse_analysis, parse_evaluation, parse_update
from kb_mcp.campaign.agent_kernel import changed_kernel_parser, parse_kernel_answer
from kb_mcp.campaign.agent_parse import AnswerError, extract_json_object
from kb_mcp.campaign.agent_review import parse_review
from kb_mcp.clients.llm import Role

MODULE = (
    "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n"
)


def test_kernel_answer_from_fence_with_prose_around() -> None:
    text = f"Here is the kernel:\n\n```python\n{MODULE}```\n\nIt fuses the two loops."
    answer = parse_kernel_answer(text)
    assert answer.source == MODULE
    assert answer.note == "It fuses the two loops."


def test_kernel_answer_takes_last_block_defining_modelnew() -> None:
    first = MODULE.replace("return x", "return x + 0")
    text = f"```python\n{first}```\nOops, better:\n```cuda\n__global__ void k() {{}}\n```\n```py\n{MODULE}```"
    assert parse_kernel_answer(text).source == MODULE


def test_kernel_answer_unfenced_module_after_prose() -> None:
    assert parse_kernel_answer("Sure! Below.\n" + MODULE).source == MODULE


def test_kernel_answer_truncated_fence_still_parses_when_complete() -> None:
    assert parse_kernel_answer(f"```python\n{MODULE}").source == MODULE


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty"),
        ("I'm sorry, but I can't help with writing that.", "declined"),
        ("```python\nimport torch\nclass Model:\n    pass\n```", "No Python module defining `class ModelNew`"),
        ("```python\nclass ModelNew(nn.Module:\n    pass\n```", "syntax error at line 1"),
        ("```python\ndef f():\n    class ModelNew: pass\n```", "top level"),
    ],
)
def test_kernel_answer_errors_carry_feedback(text: str, needle: str) -> None:
    with pytest.raises(AnswerError) as info:
        parse_kernel_answer(text)
    assert needle in info.value.feedback
    assert info.value.refusal == ("declined" in needle)


def test_lowering_parser_refuses_the_current_kernel_unchanged() -> None:
    parse = changed_kernel_parser(MODULE)
    with pytest.raises(AnswerError, match="unchanged"):
        parse(f"Done:\n```python\n{MODULE.replace(chr(10), '   ' + chr(10))}\n```")  # trailing spaces only
    changed = MODULE.replace("return x", "return x * 1")
    assert parse(f"```python\n{changed}```").source == changed


def test_json_object_found_in_prose_and_fences() -> None:
    assert extract_json_object('Verdict below.\n```json\n{"verdict": "accept"}\n```') == {"verdict": "accept"}
    assert extract_json_object('I think {"verdict": "reject", "issues": ["x"]} is right') == {
        "verdict": "reject",
        "issues": ["x"],
    }
    with pytest.raises(AnswerError):
        extract_json_object("no json {here")


def test_review_parser() -> None:
    assert parse_review('{"verdict": "ACCEPT", "summary": "same function"}').accepted
    rejected = parse_review('```json\n{"verdict": "reject", "issues": ["bias ignored at line 12"]}\n```')
    assert not rejected.accepted and rejected.issues == ["bias ignored at line 12"]
    with pytest.raises(AnswerError, match="concrete issue"):
        parse_review('{"verdict": "reject", "issues": []}')
    with pytest.raises(AnswerError, match="verdict"):
        parse_review('{"verdict": "maybe"}')


def test_gradient_parsers() -> None:
    evaluation = parse_evaluation(
        '{"summary": "s", "items": [{"state_id": "a", "optimization_id": "b", "assessment": "Overestimated"}]}'
    )
    assert evaluation.items[0].assessment == "overestimated"
    with pytest.raises(AnswerError, match="assessment"):
        parse_evaluation('{"items": [{"state_id": "a", "optimization_id": "b", "assessment": "great"}]}')
    analysis = parse_analysis('{"gaps": [{"state_id": "a", "optimization_id": "b", "cause": "spills"}]}')
    assert analysis.gaps[0].cause == "spills"
    update = parse_update('{"edits": [{"kind": "add_lesson"}, 3]}')
    assert update.edits == [{"kind": "add_lesson"}, {"value": 3}]
    with pytest.raises(AnswerError, match="edits"):
        parse_update('{"changes": []}')


def test_conversation_sends_parser_feedback_and_recovers(fake_llm, client_for) -> None:
    script = Script(
        rules=[Rule(answers=[Answer(text="I cannot help with that."), Answer(text=f"```python\n{MODULE}```")])]
    )
    server = fake_llm(script)
    conversation = Conversation(client_for(server), Role.generate, "write kernels", problem="p1")
    answer = conversation.ask("Problem: p1\nwrite it", parse_kernel_answer)
    assert answer.source == MODULE
    assert len(conversation.corrections) == 1
    second = server.requests[1]
    assert "declined the task" in second.last_user  # the feedback went back to the model
    assert second.role == "generate" and second.problem == "p1"


def test_conversation_gives_up_after_corrections(fake_llm, client_for) -> None:
    server = fake_llm(Script(rules=[Rule(answers=[Answer(text="I'm sorry, I can't assist with that.")])]))
    conversation = Conversation(client_for(server), Role.lower, "x", answer_retries=1)
    with pytest.raises(AgentFailed) as info:
        conversation.ask("Problem: p\ngo", parse_kernel_answer)
    assert info.value.refusal
    assert len(server.requests) == 2
