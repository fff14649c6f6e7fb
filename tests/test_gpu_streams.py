"""scripts/gpu-streams.sh: parts of the GPU suite side by side, each a scripts/gpu-check.sh of its own,
run for real on two small test files (marked `gpu`, so gpu-check.sh selects them; outside the
project's tests, so nothing skips them here)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu-streams.sh"
PASSING = "import pytest\n\n@pytest.mark.gpu\ndef test_ok():\n    assert True\n"
FAILING = "import pytest\n\n@pytest.mark.gpu\ndef test_broken():\n    assert 1 == 2\n"


def test_each_stream_logs_apart_and_a_failing_one_fails_the_run(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a GPU\n")
    (tmp_path / "test_a.py").write_text(PASSING)
    (tmp_path / "test_b.py").write_text(FAILING)
    env = {**os.environ, "OUT": str(tmp_path / "out"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", str(SCRIPT), "--budget-s", "300", "test_a.py", "test_b.py -p no:cacheprovider"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr  # pytest's code for a failed test, from stream 2
    lines = done.stdout.splitlines()
    assert any(line.startswith("stream 1: exit 0:") and "1 passed" in line for line in lines), done.stdout
    assert any(line.startswith("stream 2: exit 1:") and "1 failed" in line for line in lines), done.stdout
    assert "test_broken" in (tmp_path / "out" / "s2" / "gpu-tests.log").read_text()
    with tarfile.open(tmp_path / "out" / "streams.tgz") as tgz:
        names = set(tgz.getnames())
    assert {"s1/gpu-tests.log", "s1/junit.xml", "s2/gpu-tests.log", "s2/junit.xml"} <= names


def test_no_stream_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OUT": str(tmp_path / "out")})
    assert done.returncode == 2 and "usage" in done.stderr
