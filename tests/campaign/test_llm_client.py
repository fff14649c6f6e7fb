"""The LLM client against a real OpenAI-compatible HTTP server on loopback (tests/fakellm)."""

from __future__ import annotations

import time

import pytest
from fakellm import Answer, Rule, Script

from kb_mcp.clients.llm import (
    ENV_BASE_URL,
    ENV_MODEL,
    LLMClient,
    LLMConfig,
    LLMError,
    LLMNotConfigured,
    Role,
    TokenLedger,
)
from kb_mcp.clients.llm import ChatMessage as Msg


def _messages(role: Role, problem: str = "p1") -> list[Msg]:
    return [
        Msg(role="system", content=f"[kb-mcp role: {role.value}]\nbe brief"),
        Msg(role="user", content=f"Problem: {problem}\nsay hello"),
    ]


def test_unconfigured_client_says_how_to_configure() -> None:
    with pytest.raises(LLMNotConfigured) as info:
        LLMClient(LLMConfig.from_env(env={}))
    message = str(info.value)
    assert ENV_BASE_URL in message and ENV_MODEL in message and "--llm-model" in message


def test_config_precedence_flags_over_env_and_per_role_models() -> None:
    env = {
        ENV_BASE_URL: "http://env:1/v1",
        ENV_MODEL: "env-model",
        "KB_MCP_LLM_MODEL_REVIEW": "small-model",
        "KB_MCP_LLM_API_KEY": "secret-key",
    }
    config = LLMConfig.from_env(env=env, model="flag-model", base_url=None, role_models={"update": "big"})
    assert config.base_url == "http://env:1/v1"  # None flags leave the environment's value
    assert config.model_for(Role.generate) == "flag-model"
    assert config.model_for(Role.review) == "small-model"
    assert config.model_for(Role.update) == "big"
    assert config.configured
    assert "secret-key" not in config.model_dump_json()  # the key never lands in campaign files


def test_chat_counts_tokens_per_role_and_problem_and_uses_role_model(fake_llm, client_for) -> None:
    server = fake_llm(Script(rules=[Rule(answers=[Answer(text="hello there")])]))
    client = client_for(server, role_models={"review": "tiny"})
    step_ledger = TokenLedger()
    reply = client.chat(Role.generate, _messages(Role.generate, "p1"), problem="p1", ledger=step_ledger)
    client.chat(Role.review, _messages(Role.review, "p2"), problem="p2")
    assert reply.text == "hello there" and not reply.tokens_estimated
    assert [r.model for r in server.requests] == ["fake-model", "tiny"]
    ledger = client.ledger
    assert ledger.by_role["generate"].calls == 1 and ledger.by_role["review"].calls == 1
    assert ledger.by_problem["p1"].total == reply.tokens.total > 0
    assert ledger.total.calls == 2
    # the per-step ledger saw only the call it was passed to
    assert step_ledger.total.calls == 1 and set(step_ledger.by_problem) == {"p1"}


def test_server_errors_are_retried_then_succeed(fake_llm, client_for) -> None:
    script = Script(rules=[Rule(answers=[Answer(status=500), Answer(status=429), Answer(text="ok")])])
    server = fake_llm(script)
    reply = client_for(server, max_retries=3).chat(Role.lower, _messages(Role.lower))
    assert reply.text == "ok"
    assert [r.answered_status for r in server.requests] == [500, 429, 200]


def test_retries_exhausted_raise_llm_error_naming_endpoint(fake_llm, client_for) -> None:
    server = fake_llm(Script(rules=[Rule(answers=[Answer(status=503, text="overloaded")])]))
    with pytest.raises(LLMError) as info:
        client_for(server, max_retries=1).chat(Role.generate, _messages(Role.generate))
    assert server.base_url in str(info.value)
    assert len(server.requests) == 2  # one try plus one retry


def test_timeout_is_enforced(fake_llm, client_for) -> None:
    server = fake_llm(Script(rules=[Rule(answers=[Answer(text="late", delay_s=3.0)])]))
    started = time.monotonic()
    with pytest.raises(LLMError):
        client_for(server, timeout_s=0.5, max_retries=0).chat(Role.generate, _messages(Role.generate))
    assert time.monotonic() - started < 2.5


def test_missing_usage_is_estimated_and_flagged(fake_llm, client_for) -> None:
    server = fake_llm(Script(rules=[Rule(answers=[Answer(text="x" * 400, usage=False)])]))
    reply = client_for(server).chat(Role.analyze, _messages(Role.analyze))
    assert reply.tokens_estimated
    assert reply.tokens.completion_tokens == 100


def test_a_reply_that_is_no_chat_completion_is_retried_then_an_llm_error(fake_llm, client_for) -> None:
    for body in ("{not json", "<html>bad gateway</html>", '{"choices": "x"}', "[]"):
        server = fake_llm(Script(rules=[Rule(answers=[Answer(body=body)])]))
        client = client_for(server, max_retries=2)
        with pytest.raises(LLMError, match="not a chat completion"):
            client.chat(Role.generate, _messages(Role.generate))
        assert len(server.requests) == 3  # the first try and two retries
    server = fake_llm(Script(rules=[Rule(answers=[Answer(body="{not json"), Answer(text="hello")])]))
    assert client_for(server, max_retries=2).chat(Role.generate, _messages(Role.generate)).text == "hello"
