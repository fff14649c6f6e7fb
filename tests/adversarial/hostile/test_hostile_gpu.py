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
from hostile_world import CASES, ServerWorld

from kb_mcp.harness.judgment.verdict import VerifyOptions
from kb_mcp.harness.pool.pool import WorkerPool
from kb_mcp.harness.problem import load_problem
from kb_mcp.harness.sandbox.sandbox import Sandbox
from kb_mcp.kb.models import Verdict
from kb_mcp.profiling import profiler

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[3]
SWISH = load_problem(ROOT / "examples" / "problems" / "swish.py")
QUICK = VerifyOptions(timing=False, compile_baseline=False, timeout_s=60)


@pytest.fixture(scope="module")
def pool(world: ServerWorld, world_sandbox: Sandbox) -> Iterator[WorkerPool]:
    with WorkerPool(world.cache, sandbox=world_sandbox, prestart=True) as p:
        # The server's own write, before any snapshot: a problem's first verification times and
        # caches its baselines (in a worker no candidate ran in), a quick one too.
        assert p.baselines(SWISH).status == "ok"
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
