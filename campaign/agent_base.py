"""One conversation with one agent role: ask, parse the answer into a typed value, correct, retry.

Every agent of a campaign (generation, lowering, review, the three textual-gradient roles) is a
system prompt plus a typed parser; this module is the loop they share. A malformed answer is sent
back with the parser's feedback (up to `answer_retries` times) before the agent gives up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from kb_mcp.campaign.agent_parse import AnswerError
from kb_mcp.clients.llm import ChatMessage, LLMClient, Role, TokenLedger

T = TypeVar("T")

ROLE_TAG = "[kb-mcp role: {role}]"
"""First line of every system prompt: names the role in logs and lets test servers route requests."""

PROBLEM_LINE = "Problem: {name}"
"""Line naming the problem in the first user message of a conversation about one problem."""


class AgentFailed(RuntimeError):
    """The model gave no usable answer within the allowed corrections; the message says why."""

    def __init__(self, role: Role, reason: str, *, refusal: bool = False) -> None:
        super().__init__(f"{role.value}: no usable answer: {reason}")
        self.role = role
        self.reason = reason
        self.refusal = refusal


def system_prompt(role: Role, body: str) -> str:
    """The role tag followed by the role's instructions."""
    return ROLE_TAG.format(role=role.value) + "\n" + body.strip() + "\n"


class Conversation:
    """A chat with one role about one problem; keeps the history so fixes can build on it."""

    def __init__(
        self,
        llm: LLMClient,
        role: Role,
        system: str,
        *,
        problem: str | None = None,
        ledger: TokenLedger | None = None,
        answer_retries: int = 2,
    ) -> None:
        self.llm = llm
        self.role = role
        self.problem = problem
        self.ledger = ledger
        self.answer_retries = answer_retries
        self.messages: list[ChatMessage] = [ChatMessage(role="system", content=system_prompt(role, system))]
        self.corrections: list[str] = []  # parser feedback sent back, in order

    def ask(self, user: str, parse: Callable[[str], T]) -> T:
        """Sends `user`, returns the parsed answer; re-asks with the parser's feedback when malformed.

        Raises AgentFailed after `answer_retries` corrections, and lets `LLMError` (endpoint down
        after the client's own retries) propagate: that is not the model's fault.
        """
        self.messages.append(ChatMessage(role="user", content=user))
        for attempt in range(self.answer_retries + 1):
            reply = self.llm.chat(self.role, self.messages, problem=self.problem, ledger=self.ledger)
            self.messages.append(ChatMessage(role="assistant", content=reply.text))
            try:
                return parse(reply.text)
            except AnswerError as exc:
                feedback = exc.feedback
                if reply.finish_reason == "length":
                    feedback = "The answer was cut off by the length limit. Be more concise. " + feedback
                self.corrections.append(feedback)
                if attempt == self.answer_retries:
                    raise AgentFailed(self.role, feedback, refusal=exc.refusal) from exc
                self.messages.append(ChatMessage(role="user", content=feedback))
        raise AssertionError("unreachable")  # pragma: no cover
