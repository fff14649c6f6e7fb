"""Every `kb-mcp` command exits by whose a refusal is (`server/exit_status.py`): 1 the caller's
arguments or inputs, 2 a command line that cannot be used, 3 the machine. Each case runs the real
command in a process of its own, as a script or a CI job would."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kb_mcp.server import exit_status
from kb_mcp.server.gpu import detect_gpus

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = ROOT / "examples" / "problems"
SWISH = PROBLEMS / "swish.py"
NO_GPU = pytest.mark.skipif(bool(detect_gpus()), reason="refused only on a machine without a GPU")


def _kb_mcp(tmp: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """`kb-mcp --kb TMP/kb.json ARGS` with an LLM configured (an endpoint nothing listens on: no case
    here gets as far as asking it) and a home of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KB_MCP_")}
    env.update(KB_MCP_HOME=str(tmp / "home"), KB_MCP_LLM_BASE_URL="http://127.0.0.1:9/v1", KB_MCP_LLM_MODEL="m")
    return subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(tmp / "kb.json"), *map(str, args)],
                          env=env, capture_output=True, text=True, timeout=180, cwd=ROOT, stdin=subprocess.DEVNULL)


@pytest.fixture()
def below_a_file(tmp_path: Path) -> Path:
    """A path below a regular file: no folder can be made there, for root too."""
    (tmp_path / "file").write_text("not a folder\n")
    return tmp_path / "file" / "sub"


def _refused(proc: subprocess.CompletedProcess[str], status: int, said: str) -> None:
    assert (proc.returncode, "Traceback" in proc.stderr) == (status, False), proc.stderr
    assert said in proc.stderr, proc.stderr


# -- the caller's: arguments or inputs refused (1) -------------------------------------------------


def test_a_model_file_that_does_not_exist_is_the_callers_in_a_campaign(tmp_path: Path) -> None:
    _refused(_kb_mcp(tmp_path, "run-campaign", "--model", tmp_path / "nope.py"), exit_status.CALLER,
             "--model takes model problem files")


def test_a_solutions_folder_that_does_not_exist_is_the_callers_in_an_eval(tmp_path: Path) -> None:
    proc = _kb_mcp(tmp_path, "eval", PROBLEMS, "--solutions", tmp_path / "nope", "--compile-only",
                   "--out", tmp_path / "eval")
    _refused(proc, exit_status.CALLER, "solutions folder not found")


def test_a_problem_file_that_does_not_exist_is_the_callers_to_decompose(tmp_path: Path) -> None:
    _refused(_kb_mcp(tmp_path, "decompose", tmp_path / "nope.py"), exit_status.CALLER, "no problem file at")


def test_an_argument_file_that_does_not_exist_is_the_callers_in_a_call(tmp_path: Path) -> None:
    proc = _kb_mcp(tmp_path, "call", "suggest_optimizations", "--arg", f"state_id=@{tmp_path / 'nope'}")
    _refused(proc, exit_status.CALLER, f"cannot read the file {tmp_path / 'nope'}")


def test_an_agents_file_that_does_not_exist_is_the_callers_to_serve(tmp_path: Path) -> None:
    proc = _kb_mcp(tmp_path, "serve", "--http", "127.0.0.1:8799", "--agents-file", tmp_path / "nope")
    _refused(proc, exit_status.CALLER, "cannot read the agents file")


# -- the command line's: an option no run could use (2) ---------------------------------------------


def test_a_role_model_without_a_role_is_the_command_lines(tmp_path: Path) -> None:
    _refused(_kb_mcp(tmp_path, "run-campaign", SWISH, "--llm-model-for", "bogus"), exit_status.USAGE,
             "--llm-model-for expects ROLE=MODEL")


def test_a_level_below_one_is_the_command_lines_in_an_eval(tmp_path: Path) -> None:
    proc = _kb_mcp(tmp_path, "eval", PROBLEMS, "--solutions", tmp_path, "--level", "0", "--compile-only")
    _refused(proc, exit_status.USAGE, "--level 0: input should be greater than or equal to 1")


# -- the environment's: the machine (3) -------------------------------------------------------------


def test_a_campaign_folder_below_a_file_is_the_machines(tmp_path: Path, below_a_file: Path) -> None:
    proc = _kb_mcp(tmp_path, "run-campaign", SWISH, "--compile-only", "--out", below_a_file)
    _refused(proc, exit_status.ENVIRONMENT, f"cannot create the folder {below_a_file}")


def test_an_eval_folder_below_a_file_is_the_machines(tmp_path: Path, below_a_file: Path) -> None:
    proc = _kb_mcp(tmp_path, "eval", PROBLEMS, "--solutions", tmp_path, "--compile-only", "--out", below_a_file)
    _refused(proc, exit_status.ENVIRONMENT, f"cannot create the folder {below_a_file}")


def test_a_port_already_in_use_is_the_machines_to_serve(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _kb_mcp(tmp_path, "serve", "--http", f"127.0.0.1:{port}")
    _refused(proc, exit_status.ENVIRONMENT, f"cannot bind 127.0.0.1:{port}")


@NO_GPU
def test_gpus_on_a_machine_without_one_are_the_machines_in_a_campaign(tmp_path: Path) -> None:
    _refused(_kb_mcp(tmp_path, "run-campaign", SWISH, "--gpus", "2"), exit_status.ENVIRONMENT,
             "this machine shows none")

