"""Running `kb-mcp run-campaign` as a real subprocess against the scripted LLM server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from fakellm import FakeLLMServer
from fakellm.campaign_script import campaign_script
from fakellm.server import Script

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = ROOT / "examples" / "problems"
SWISH = PROBLEMS / "swish.py"
CHAIN = PROBLEMS / "elementwise_chain_small.py"


def slow_campaign_script(delay_s: float = 0.4) -> Script:
    """The scripted campaign with each lowering answer `delay_s` late: a step stays in flight long
    enough for a test to interrupt it."""
    script = campaign_script()
    for rule in script.rules:
        if rule.role == "lower":
            for answer in rule.answers:
                answer.delay_s = delay_s
    return script


def campaign_env(server: FakeLLMServer, home: Path) -> dict[str, str]:
    """The environment of a campaign process: the fake endpoint, an isolated home."""
    env = dict(os.environ)
    env.update(
        {
            "KB_MCP_LLM_BASE_URL": server.base_url,
            "KB_MCP_LLM_MODEL": "fake-model",
            "KB_MCP_LLM_API_KEY": "test-key",
            "KB_MCP_LLM_MAX_RETRIES": "2",
            "KB_MCP_HOME": str(home),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.pop("KB_MCP_KB", None)
    return env


def campaign_command(kb: Path, out: Path, problems: list[Path], *flags: str) -> list[str]:
    """`kb-mcp --kb KB run-campaign PROBLEMS --out OUT FLAGS` through this interpreter."""
    return [sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(kb), "run-campaign",
            *[str(p) for p in problems], "--out", str(out), "--no-progress", *flags]


def start_campaign(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Starts the campaign process with its output going to `log`, and SIGINT able to interrupt it.

    A test run started in the background (`pytest ... &` from a script) has SIGINT ignored, and
    an ignored signal stays ignored across exec: the campaign would never see the test's SIGINT
    and run to its end. A handled signal is reset to the default at exec, so holding a handler
    while the child starts gives it the default, whatever this process inherited.
    """
    handle = log.open("ab")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(cmd, env=env, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT)
    finally:
        signal.signal(signal.SIGINT, previous)


def run_campaign_process(cmd: list[str], env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Runs the campaign to its end; the output is in the result."""
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
