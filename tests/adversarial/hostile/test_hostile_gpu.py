"""Hostile candidates on the GPU paths (run with scripts/gpu-check.sh): the verify worker, which
imports, builds, checks and times them; the build service, which builds their `load_inline`
extensions; and the profiling driver under ncu. Each attack runs for real, confined; the server's
world must stay byte-identical, and no secret may come back in the verdict, its output or the
profile.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hostile_world import CASES, TRIED, ServerWorld

from kb_mcp.harness.judgment.verdict import FindingCode, VerifyOptions, VerifyResult
from kb_mcp.harness.pool.pool import WorkerPool
from kb_mcp.harness.problem import load_problem
from kb_mcp.harness.sandbox.sandbox import Sandbox
from kb_mcp.kb.models import Verdict
from kb_mcp.profiling import profiler

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[3]
SWISH = load_problem(ROOT / "examples" / "problems" / "swish.py")
QUICK = VerifyOptions(timing=False, compile_baseline=False, timeout_s=60)
HONEST = ROOT / "examples" / "candidates" / "swish_nvrtc.py"


@pytest.fixture(scope="module")
def pool(world: ServerWorld, world_sandbox: Sandbox) -> Iterator[WorkerPool]:
    with WorkerPool(world.cache, sandbox=world_sandbox, prestart=True) as p:
        # The server's own write, before any snapshot: a problem's first verification times and
        # caches its baselines (in a worker no candidate ran in), a quick one too.
        assert p.baselines(SWISH).status == "ok"
        # and a problem's first valid verdict completes its baselines' record in the cache: an honest
        # candidate's, before any snapshot, so that a hostile one's valid verdict writes nothing new
        assert p.verify(SWISH, HONEST.read_text(), QUICK).verdict in (Verdict.faster, Verdict.slower)
        yield p


@pytest.mark.parametrize("name", CASES)
def test_verified_on_the_gpu_it_changes_nothing(pool: WorkerPool, world: ServerWorld, name: str) -> None:
    before = world.snapshot()
    result = pool.verify(SWISH, world.render(name), QUICK)
    # None of them is a valid candidate (they call torch.sigmoid, or fail to build, or crash).
    assert result.verdict not in (Verdict.faster, Verdict.slower), result.summary
    world.assert_untouched(before, result.model_dump_json())
    if name == "read_secrets.py":
        assert result.verdict == Verdict.crashed and "LOOT" in result.summary
    if name in ("compiler_flag_tricks.py", "include_tricks.py"):
        assert result.verdict in (Verdict.crashed, Verdict.compile_error), result.summary


def test_profiling_a_hostile_candidate_changes_nothing(world: ServerWorld, world_sandbox: Sandbox,
                                                       tmp_path: Path) -> None:
    """The profiling driver runs the candidate under ncu, in its sandbox."""
    before = world.snapshot()
    texts = []
    for name in ("delete_kb.py", "subprocess_spellings.py", "network_exfiltration.py", "read_secrets.py"):
        try:
            prof = profiler.profile(SWISH, world.render(name), profile_id="p_0000000000aa",
                                    report_base=tmp_path / name, cache_dir=world.cache,
                                    options=profiler.ProfileOptions(timeout_s=240), sandbox=world_sandbox)
            texts.append(prof.model_dump_json())
        except profiler.ProfilerError as exc:  # read_secrets raises in forward: the error comes back
            texts.append(str(exc))
    world.assert_untouched(before, *texts)
    assert any("LOOT" in t for t in texts), texts  # read_secrets ran, and what it found came back


# Hostile classes whose working-kernel variant passes the static checks: the attack runs at import
# in the verify worker, the kernel is real, the verdict is measured and flagged.
MEASURED = ["cpp_static_constructor.py", "delete_kb.py", "forge_job_record.py", "forge_journal.py", "read_secrets.py",
            "write_outside_scratch.py"]


def attempt_of(result: VerifyResult) -> str:
    found = [f.message for f in result.findings if f.code == FindingCode.sandbox_attempt]
    assert len(found) == 1, (result.summary, result.findings)
    return found[0]


@pytest.mark.parametrize("name", MEASURED)
def test_a_hostile_candidate_with_a_working_kernel_is_measured_but_flagged(pool: WorkerPool, world: ServerWorld,
                                                                           name: str) -> None:
    before = world.snapshot()
    result = pool.verify(SWISH, world.with_working_kernel(name), QUICK)
    assert result.verdict in (Verdict.faster, Verdict.slower) and result.flagged, result.summary
    tried = attempt_of(result)
    for what in TRIED[name]:
        assert what in tried, tried
    assert result.attempts == "recorded" and "[flagged: sandbox_attempt:" in result.summary
    record = result.record(QUICK)
    assert record.flagged and record.attempt == tried and "sandbox_attempt" in record.findings
    world.assert_untouched(before, result.model_dump_json())


def test_under_the_invalid_policy_such_a_candidate_is_invalid(pool: WorkerPool, world: ServerWorld,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KB_MCP_ATTEMPTS", "invalid")
    result = pool.verify(SWISH, world.with_working_kernel("delete_kb.py"), QUICK)
    assert result.verdict == Verdict.invalid and result.summary.startswith("invalid (sandbox_attempt)"), result.summary
    assert "kb.json" in attempt_of(result)


@pytest.mark.parametrize("name", ["network_exfiltration.py", "subprocess_spellings.py"])
def test_a_statically_caught_class_stays_invalid_with_its_kernel(pool: WorkerPool, world: ServerWorld,
                                                                 name: str) -> None:
    before = world.snapshot()
    result = pool.verify(SWISH, world.with_working_kernel(name), QUICK)
    assert result.verdict == Verdict.invalid, result.summary
    for f in result.findings:  # where the worker ran it, the record names what it tried
        if f.code == FindingCode.sandbox_attempt:
            assert any(what in f.message for what in TRIED[name]), f.message
    world.assert_untouched(before, result.model_dump_json())


@pytest.mark.parametrize("name", ["compiler_flag_tricks.py", "include_tricks.py"])
def test_compiler_tricks_on_the_gpu_carry_what_they_tried(pool: WorkerPool, world: ServerWorld, name: str) -> None:
    """Their builds are refused (by the build service, or NVRTC finds no file): a build attempt, or a
    private read the worker's NVRTC made, is on the verdict."""
    result = pool.verify(SWISH, world.render(name), QUICK)
    assert result.verdict in (Verdict.crashed, Verdict.compile_error) and result.flagged, result.summary
    tried = attempt_of(result)
    if name == "compiler_flag_tricks.py":
        assert "build: hostile_flags: CUDA compiler flag -wrapper" in tried and "(build)" in tried, tried
    else:
        assert ".ssh/id_rsa" in tried, tried


def test_an_honest_gpu_candidate_leaves_no_finding(pool: WorkerPool) -> None:
    result = pool.verify(SWISH, HONEST.read_text(), QUICK)
    assert result.verdict in (Verdict.faster, Verdict.slower) and not result.flagged, result.summary
    assert not [f for f in result.findings if f.code == FindingCode.sandbox_attempt]
    assert result.attempts == "recorded" and result.record(QUICK).attempt == ""


def test_a_profile_carries_what_its_driver_tried(world: ServerWorld, world_sandbox: Sandbox, tmp_path: Path) -> None:
    """The profiling driver (under ncu, or the timeline without it) is watched like the worker."""
    before = world.snapshot()
    options = profiler.ProfileOptions(timeout_s=240)
    hostile = profiler.profile(SWISH, world.with_working_kernel("delete_kb.py"), profile_id="p_0000000000ab",
                               report_base=tmp_path / "hostile", cache_dir=world.cache, options=options,
                               sandbox=world_sandbox)
    assert hostile.kernels and "kb.json" in hostile.attempt and "(driver)" in hostile.attempt, hostile.attempt
    honest = profiler.profile(SWISH, HONEST.read_text(), profile_id="p_0000000000ac", report_base=tmp_path / "honest",
                              cache_dir=world.cache, options=options, sandbox=world_sandbox)
    assert honest.kernels and honest.attempt == "", honest.attempt
    world.assert_untouched(before, hostile.model_dump_json(), honest.model_dump_json())
