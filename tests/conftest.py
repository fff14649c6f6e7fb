"""Shared test set-up: keep every test away from the user's real KB, and skip GPU or
nvcc tests with a visible reason on machines that lack them."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken torch install must not break collection of CPU tests
        return False


HAS_CUDA = _cuda_available()
HAS_NVCC = shutil.which("nvcc") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU: run scripts/gpu-check.sh on a GPU machine")
    skip_nvcc = pytest.mark.skip(reason="needs nvcc (the CUDA compiler) on PATH")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
        if "nvcc" in item.keywords and not HAS_NVCC:
            item.add_marker(skip_nvcc)


# Set by scripts/gpu-check.sh for a run inside a device call's limit: past this time (Unix seconds)
# no test starts, so the run ends by itself and prints its summary; and each failure is written to
# this file the moment it happens, so a run cut short still says why a test failed.
DEADLINE_ENV = "KBMCP_TEST_DEADLINE"
FAILURE_LOG_ENV = "KBMCP_FAILURE_LOG"


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skips a test that would start after the run's deadline (`DEADLINE_ENV`), saying so."""
    deadline = os.environ.get(DEADLINE_ENV)
    if deadline and time.time() > float(deadline):
        pytest.skip(f"the run's time budget was spent before this test started ({DEADLINE_ENV})")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Appends a failure with its traceback to `FAILURE_LOG_ENV`'s file as soon as it is known."""
    path = os.environ.get(FAILURE_LOG_ENV)
    if not path or not report.failed:
        return
    with open(path, "a", encoding="utf-8") as log:
        log.write(f"=== {report.nodeid} ({report.when}, {report.duration:.1f} s)\n{report.longreprtext}\n\n")


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Points KB_MCP_HOME at a fresh folder so no test reads or writes ~/.kb-mcp.

    The build cache (KB_MCP_CACHE) is shared by the whole test session: compiled candidates
    are keyed by content hash, so sharing is safe and keeps repeated builds cheap.
    """
    home = tmp_path_factory.mktemp("kbhome")
    monkeypatch.setenv("KB_MCP_HOME", str(home))
    monkeypatch.delenv("KB_MCP_KB", raising=False)
    monkeypatch.setenv("KB_MCP_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    return home


# Words the harness keeps for defects of its own (`harness.worker.main._internal_error`): a verdict
# that says them in any test is a bug of ours, whatever the test checks (issue 24).
INTERNAL_ERRORS = ("internal harness error", "internal error of the census worker")
_UNCHECKED: dict[str, object] = {}


def assert_no_internal_error(summary: str) -> None:
    """Fails the test on a verdict that blames the harness itself."""
    found = [w for w in INTERNAL_ERRORS if w in summary]
    assert not found, f"the harness reported a defect of its own: {summary}"


def pytest_configure(config: pytest.Config) -> None:
    """Every verdict and census a worker pool gives in any test is checked for an internal error.
    The pool's methods are wrapped once for the whole session, not per test: the harness's trusted
    snapshot (`worker.trusted`), which tests also capture in this process, sees the same functions
    throughout."""
    from kb_mcp.harness.pool.pool import WorkerPool

    verify, census = WorkerPool.verify, WorkerPool.census
    _UNCHECKED.update(verify=verify, census=census)

    def checked_verify(self: WorkerPool, *args: object, **kwargs: object) -> object:
        result = verify(self, *args, **kwargs)  # type: ignore[arg-type]
        assert_no_internal_error(result.summary)
        return result

    def checked_census(self: WorkerPool, *args: object, **kwargs: object) -> object:
        reply = census(self, *args, **kwargs)  # type: ignore[arg-type]
        assert_no_internal_error(reply.summary)
        return reply

    WorkerPool.verify = checked_verify  # type: ignore[assignment,method-assign]
    WorkerPool.census = checked_census  # type: ignore[assignment,method-assign]


def pytest_unconfigure(config: pytest.Config) -> None:
    """The pool's own methods back."""
    from kb_mcp.harness.pool.pool import WorkerPool

    for name, method in _UNCHECKED.items():
        setattr(WorkerPool, name, method)


@pytest.fixture
def kb_path(tmp_path: Path) -> Path:
    """A path for a fresh KB file (not yet created)."""
    return tmp_path / "kb.json"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A run that executed no test is a failure, even if everything it collected was skipped."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or exitstatus != 0:
        return
    ran = len(reporter.stats.get("passed", [])) + len(reporter.stats.get("failed", []))
    if ran == 0:
        reporter.write_line("no test ran (all skipped or deselected): failing the run", red=True)
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
