"""The server's caps on the limits a caller may ask for."""

from __future__ import annotations

import pytest

from kb_mcp.harness.judgment.caps import Caps
from kb_mcp.harness.judgment.verdict import VerifyOptions
from kb_mcp.kb.errors import SettingError


def test_caps_bound_the_limits_a_caller_may_ask_for() -> None:
    caps = Caps.from_env({"KB_MCP_MAX_TIMEOUT_S": "300"})
    assert caps.refusal(VerifyOptions(timeout_s=300)) is None
    refusal = caps.refusal(VerifyOptions(timeout_s=3600))
    assert refusal is not None and "timeout_s=3600" in refusal and "cap of 300" in refusal
    assert Caps().refusal(VerifyOptions(compile_timeout_s=3000)) is not None


def test_unset_or_empty_caps_are_the_defaults_and_good_ones_are_read() -> None:
    blank = {"KB_MCP_MAX_TIMEOUT_S": " ", "KB_MCP_MAX_COMPILE_TIMEOUT_S": ""}
    assert Caps.from_env({}) == Caps() == Caps.from_env(blank)
    assert Caps.from_env({"KB_MCP_MAX_COMPILE_TIMEOUT_S": " 90.5 "}).compile_timeout_s == 90.5


@pytest.mark.parametrize("variable", ["KB_MCP_MAX_TIMEOUT_S", "KB_MCP_MAX_COMPILE_TIMEOUT_S"])
@pytest.mark.parametrize("value", ["lots", "0", "-5", "nan", "inf", "1e400"])
def test_a_cap_that_would_refuse_every_verification_is_refused_by_name(variable: str, value: str) -> None:
    """A cap of 0, below 0, NaN or no number at all leaves no limit a caller could ask for (and an
    infinite one is no cap): the operator's setting is refused, not each caller's request."""
    with pytest.raises(SettingError) as refused:
        Caps.from_env({variable: value})
    assert refused.value.whose == "environment" and refused.value.where == variable
    assert f"${variable}={value!r} is not a number of seconds, more than 0" in str(refused.value)
    assert "unset it for the default" in str(refused.value)
