"""The test run's own hooks (tests/conftest.py), run for real in a child pytest: the deadline that
stops new tests inside a device call's limit, and the failure log written as failures happen."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent

TESTS = '''
def test_ok():
    assert True

def test_fails():
    assert 1 + 1 == 3, "arithmetic broke here"
'''


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_child.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a GPU\n    nvcc: needs nvcc\n")
    full = {**os.environ, **env}
    return subprocess.run([sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env=full, capture_output=True, text=True, timeout=300)


def test_a_failure_is_logged_with_its_traceback_as_it_happens(tmp_path: Path) -> None:
    log = tmp_path / "failures.txt"
    done = _run(tmp_path, KBMCP_FAILURE_LOG=str(log), KBMCP_TEST_DEADLINE=str(time.time() + 600))
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout
    text = log.read_text()
    assert "test_child.py::test_fails (call," in text and "arithmetic broke here" in text
    assert "test_ok" not in text


def test_no_test_starts_after_the_deadline_and_the_run_says_why(tmp_path: Path) -> None:
    log = tmp_path / "failures.txt"
    done = _run(tmp_path, KBMCP_FAILURE_LOG=str(log), KBMCP_TEST_DEADLINE=str(time.time() - 1))
    assert "the run's time budget was spent" in done.stdout, done.stdout
    assert "2 skipped" in done.stdout and not log.exists()
    # nothing ran: the run fails rather than pass green
    assert done.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, done.stdout
