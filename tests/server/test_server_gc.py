"""Retention (server.gc, `kb-mcp kb gc`, job records at server start) on real files: old leftovers
go, and nothing a KB record points to, no unfinished job and no running worker's folder is touched."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from kb_mcp.kb import paths
from kb_mcp.kb.models import CandidateRecord, Outcome, Verdict, utcnow
from kb_mcp.kb.store import KBStore
from kb_mcp.server import gc
from kb_mcp.server.job_store import JobRecord, JobStore
from kb_mcp.tools import candidate_store

DAY = 86400


def _age(path: Path, days: float) -> None:
    t = time.time() - days * DAY
    os.utime(path, (t, t))


def _job(store: JobStore, job_id: str, status: str, days_ago: float, owner: str = "elsewhere:1") -> None:
    when = utcnow() - timedelta(days=days_ago)
    store.write(JobRecord(job_id=job_id, kind="toy_count", status=status, owner=owner, created_at=when,
                          finished_at=when if status in ("succeeded", "failed") else None))
    Path(str(store.path(job_id)) + ".lock").write_text("")


def _setup(kb_path: Path, cache: Path) -> gc.GcScope:
    store = KBStore.open(kb_path)
    art = paths.artifacts_dir(kb_path)
    cands = art / "candidates"
    cands.mkdir(parents=True)
    with store.transaction() as tx:
        for cid in ("c_recorded", "c_parent", "c_lonely", "c_young"):
            tx.put_candidate(CandidateRecord(candidate_id=cid, problem="p", problem_hash="h", verdict=Verdict.faster))
        tx.put_outcome(Outcome(id="o1", problem="p", candidate_id="c_recorded", parent_candidate_id="c_parent",
                               state_id="s", optimization_id="o", arch="hopper", verdict=Verdict.faster))
    for cid in ("c_recorded", "c_parent", "c_lonely", "c_young", "c_pending"):
        for ext in (".py", ".json"):
            (cands / f"{cid}{ext}").write_text("x" * 1000)
            _age(cands / f"{cid}{ext}", 1 if cid == "c_young" else 90)
    store.pending_dir.mkdir(parents=True)
    waiting = CandidateRecord(candidate_id="c_pending", problem="p", problem_hash="h", verdict=Verdict.faster,
                              verified_by=["agent"])
    (store.pending_dir / f"{candidate_store.pending_key(waiting)}.json").write_text("{}")
    return gc.GcScope(store=store, artifacts=art, cache=cache, limits=gc.Retention())


def test_unrecorded_candidates_go_and_what_a_record_points_to_stays(kb_path: Path, tmp_path: Path) -> None:
    ctx = _setup(kb_path, tmp_path / "cache")
    report = gc.collect(ctx, [("unrecorded candidates", gc.unrecorded_candidates)])
    gone = sorted(i.path.name for i in report.removed["unrecorded candidates"])
    assert gone == ["c_lonely.json", "c_lonely.py"]
    left = sorted(p.name for p in (ctx.artifacts / "candidates").iterdir())
    assert left == sorted(f"{c}{e}" for c in ("c_recorded", "c_parent", "c_young",
                                              "c_pending") for e in (".json", ".py"))
    assert ctx.store.get_candidate("c_lonely") is not None  # the verdict itself stays in the KB


def test_job_records_past_retention_go_unfinished_ones_stay(tmp_path: Path) -> None:
    jobs = JobStore(tmp_path / "jobs")
    _job(jobs, "j_20200101000000_aaaaaa", "succeeded", 30)
    _job(jobs, "j_20200101000001_bbbbbb", "failed", 1)
    _job(jobs, "j_20200101000002_cccccc", "running", 30, owner=f"{os.uname().nodename}:{os.getpid()}")  # alive
    for i in range(5):
        _job(jobs, f"j_2021010100000{i}_dddddd", "succeeded", 0.1)
    assert jobs.prune(max_age_s=14 * DAY, keep=5) == 2  # one too old, one beyond the newest 5 finished
    left = sorted(p.name for p in (tmp_path / "jobs").iterdir())
    assert "j_20200101000000_aaaaaa.json" not in left and "j_20200101000000_aaaaaa.json.lock" not in left
    assert "j_20200101000001_bbbbbb.json" not in left
    assert "j_20200101000002_cccccc.json" in left  # still running: never expires
    assert len([n for n in left if n.endswith(".json")]) == 6


def test_worker_scratch_of_exited_workers_goes_and_running_ones_keep_their_fresh_files(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_dir = cache / "work" / dead.stdout.strip()
    live_dir = cache / "work" / str(os.getpid())
    for folder in (dead_dir, live_dir):
        folder.mkdir(parents=True)
        (folder / "kbmcp_candidate.py").write_bytes(b"x" * 20_000_000)  # a 20 MB candidate
        (folder / "fresh.py").write_text("y")
    _age(live_dir / "kbmcp_candidate.py", 2)
    ctx = gc.GcScope(store=None, artifacts=tmp_path, cache=cache, limits=gc.Retention())  # type: ignore[arg-type]
    report = gc.collect(ctx, [("worker scratch", gc.worker_scratch)])
    assert not dead_dir.exists()
    assert sorted(p.name for p in live_dir.iterdir()) == ["fresh.py"]
    assert report.total()[1] >= 40_000_000


def test_build_cache_goes_by_age_then_by_size_oldest_first(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    for i, days in enumerate((60, 10, 5, 0.001)):
        entry = cache / "torch_extensions" / f"ext{i}"
        entry.mkdir(parents=True)
        (entry / "lib.so").write_bytes(b"z" * 1_000_000)
        _age(entry, days)
    ctx = gc.GcScope(store=None, artifacts=tmp_path, cache=cache,  # type: ignore[arg-type]
                     limits=gc.Retention(cache_days=30, cache_max_mb=2.5))
    gc.collect(ctx, [("build cache", gc.build_cache)])
    # ext0 is too old; then the total (3 MB) is over 2.5 MB: the oldest, ext1, goes
    assert sorted(p.name for p in (cache / "torch_extensions").iterdir()) == ["ext2", "ext3"]
    tight = gc.GcScope(store=None, artifacts=tmp_path, cache=cache,  # type: ignore[arg-type]
                       limits=gc.Retention(cache_days=30, cache_max_mb=0.1))
    gc.collect(tight, [("build cache", gc.build_cache)])
    assert sorted(p.name for p in (cache / "torch_extensions").iterdir()) == ["ext3"]  # in use in the last hour


def test_kb_gc_command_lists_then_removes(kb_path: Path, tmp_path: Path) -> None:
    _setup(kb_path, tmp_path / "cache")
    cli = [sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(kb_path), "kb", "gc"]
    env = {**os.environ, paths.ENV_CACHE: str(tmp_path / "cache")}
    dry = subprocess.run([*cli, "--dry-run"], capture_output=True, text=True, timeout=120, env=env)
    assert dry.returncode == 0 and "unrecorded candidates: would remove 2" in dry.stdout, dry.stderr
    assert (paths.artifacts_dir(kb_path) / "candidates" / "c_lonely.py").exists()
    done = subprocess.run(cli, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and "unrecorded candidates: removed 2" in done.stdout, done.stderr
    assert not (paths.artifacts_dir(kb_path) / "candidates" / "c_lonely.py").exists()


@pytest.mark.parametrize("flags", [["--jobs-kept", "-5"], ["--job-days", "-1"], ["--cache-max-mb", "nan"]])
def test_a_negative_retention_is_refused_and_removes_nothing(kb_path: Path, tmp_path: Path, flags: list[str]) -> None:
    KBStore.open(kb_path)
    jobs = JobStore(paths.artifacts_dir(kb_path) / "jobs")
    _job(jobs, "j_20210101000000_dddddd", "succeeded", 0.1)
    env = {**os.environ, paths.ENV_CACHE: str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(kb_path), "kb", "gc", *flags],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"{flags[0]} {flags[1]}: must be a number, 0 or more" in done.stderr
    assert jobs.path("j_20210101000000_dddddd").exists()  # before: -5 kept none, -1 day expired all


def test_the_candidate_a_composition_takes_stays_however_old(kb_path: Path, tmp_path: Path) -> None:
    ctx = _setup(kb_path, tmp_path / "cache")
    cands = ctx.artifacts / "candidates"
    with ctx.store.transaction() as tx:  # two standard faster verdicts on one part: a composition takes the faster
        for cid, speedup in (("c_best", 2.0), ("c_second", 1.5)):
            tx.put_candidate(CandidateRecord(candidate_id=cid, problem="part01", problem_hash="hp",
                                             verdict=Verdict.faster, device="H100", arch="sm_90", time_ms=1.0,
                                             eager_ms=speedup, speedup_vs_baseline=speedup))
            (cands / f"{cid}.py").write_text("x" * 1000)
            _age(cands / f"{cid}.py", 90)
    report = gc.collect(ctx, [("unrecorded candidates", gc.unrecorded_candidates)])
    gone = {i.path.name for i in report.removed["unrecorded candidates"]}
    assert {"c_lonely.py", "c_second.py"} <= gone and "c_best.py" not in gone
    assert (cands / "c_best.py").is_file()
