"""The server's caps on the limits a caller may ask for."""

from __future__ import annotations

import pytest

from kb_mcp.harness.judgment.caps import Caps
from kb_mcp.harness.judgment.verdict import VerifyOptions


def test_caps_bound_the_limits_a_caller_may_ask_for() -> None:
    caps = Caps.from_env({"KB_MCP_MAX_TIMEOUT_S": "300"})
    assert caps.refusal(VerifyOptions(timeout_s=300)) is None
    refusal = caps.refusal(VerifyOptions(timeout_s=3600))
    assert refusal is not None and "timeout_s=3600" in refusal and "cap of 300" in refusal
    assert Caps().refusal(VerifyOptions(compile_timeout_s=3000)) is not None
    with pytest.raises(ValueError, match="KB_MCP_MAX_TIMEOUT_S"):
        Caps.from_env({"KB_MCP_MAX_TIMEOUT_S": "lots"})
