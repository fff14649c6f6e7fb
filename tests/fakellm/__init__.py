"""A scripted OpenAI-compatible chat-completions server on loopback, for campaign tests."""

from fakellm.server import Answer, FakeLLMServer, RecordedRequest, Rule, Script

__all__ = ["Answer", "FakeLLMServer", "RecordedRequest", "Rule", "Script"]
