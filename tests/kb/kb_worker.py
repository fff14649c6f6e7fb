"""Helper process for the concurrency and crash tests (run as a script, never collected).

    python kb_worker.py record KB PREFIX N      record N outcomes through the record_outcome tool
    python kb_worker.py churn KB START          write transactions forever, printing each committed index
    python kb_worker.py hold KB                 take the KB lock, print "held", then hang (a hung holder)
    python kb_worker.py stall KB                take the lock, put c_stalled, print "held", commit after a
                                                line on stdin; print "committed" or "refused"
    python kb_worker.py chaos KB PREFIX         like churn, with its own ids, printing "conflict" when a
                                                transaction is refused (it is then tried again)
    python kb_worker.py put KB ID               put candidate ID in one transaction; print "in" inside it,
                                                then "committed" or "refused"
    python kb_worker.py fold-stall KB STEP      put c_folder in a transaction that compacts the KB, stopping at
                                                STEP of the compaction ("replace": the KB file, "reset": the
                                                journal) until a line on stdin; "paused", then as put
    python kb_worker.py verdicts KB PREFIX N T  store N verdicts through compile_and_verify.record from T
                                                threads at once, each thread storing all N (the same keys)
"""

from __future__ import annotations

import os
import sys
import time
from types import FrameType
from typing import Any

from kb_mcp.kb import journal
from kb_mcp.kb.errors import KBConflictError
from kb_mcp.kb.models import CandidateRecord, Score, Verdict
from kb_mcp.kb.store import KBStore

STATE = "memory_bandwidth_saturated"
OPT = "vectorize_global_access"


def time_ms(prefix: str, i: int) -> float:
    """Deterministic candidate time, so the test can recompute the expected mean."""
    return 1.0 + ((hash_str(prefix) + i * 7919) % 1000) / 1000.0


def hash_str(text: str) -> int:
    return sum((j + 1) * ord(c) for j, c in enumerate(text))


def record(kb: str, prefix: str, n: int) -> None:
    # imported here: the crash tests start 50 writers that need only the store
    from kb_mcp.tools import record_outcome
    from kb_mcp.tools.context import ToolContext

    ctx = ToolContext(kb, client_name=prefix)
    with ctx.store.transaction() as tx:  # the verdicts compile_and_verify would have stored
        for i in range(n):
            tx.put_candidate(
                CandidateRecord(candidate_id=f"c_{prefix}_{i}", problem="p", problem_hash="h", verdict=Verdict.faster,
                                arch="sm_90", time_ms=time_ms(prefix, i), eager_ms=2.0)
            )
    for i in range(n):  # one transaction per record, racing the other processes
        record_outcome.run(ctx, record_outcome.Request(state_id=STATE, optimization_id=OPT,
                                                       candidate_id=f"c_{prefix}_{i}"))


def churn(kb: str, start: int) -> None:
    # tiny compaction threshold: most kills land in a journal append or a full-file rewrite
    store = KBStore.open(kb, compact_min_bytes=3000, compact_fraction=0.0)
    i = start
    while True:
        with store.transaction() as tx:
            tx.put_candidate(CandidateRecord(candidate_id=f"c_{i}", problem="p", problem_hash="h",
                                             verdict=Verdict.slower))
            tx.put_score(Score(state_id=STATE, optimization_id=OPT, arch="hopper", samples=i, attempts=i, prior=False,
                               mean_log_speedup=0.001 * i))
        print(i, flush=True)  # printed only after the commit returned: this index must survive
        i += 1


def hold(kb: str) -> None:
    store = KBStore.open(kb)
    with store.transaction():
        print("held", flush=True)
        time.sleep(3600)


def stall(kb: str) -> None:
    store = KBStore.open(kb)
    try:
        with store.transaction() as tx:
            tx.put_candidate(CandidateRecord(candidate_id="c_stalled", problem="p", problem_hash="h",
                                             verdict=Verdict.slower))
            print("held", flush=True)
            sys.stdin.readline()  # hangs here while the test deletes the lock file and others write
    except KBConflictError:
        print("refused", flush=True)
    else:
        print("committed", flush=True)


def chaos(kb: str, prefix: str) -> None:
    store = KBStore.open(kb, compact_min_bytes=20_000, compact_fraction=0.0)
    i = 0
    while True:
        try:
            with store.transaction() as tx:
                tx.put_candidate(CandidateRecord(candidate_id=f"c_{prefix}_{i}", problem="p", problem_hash="h",
                                                 verdict=Verdict.slower))
        except KBConflictError:
            print("conflict", flush=True)
            continue
        print(i, flush=True)  # acknowledged: it must survive
        i += 1


def put(store: KBStore, candidate_id: str) -> None:
    try:
        with store.transaction() as tx:
            tx.put_candidate(CandidateRecord(candidate_id=candidate_id, problem="p", problem_hash="h",
                                             verdict=Verdict.slower))
            print("in", flush=True)
    except KBConflictError:
        print("refused", flush=True)
    else:
        print("committed", flush=True)


def fold_stall(kb: str, step: str) -> None:
    """`put` of c_folder with a compaction after its journal line, stopped just before the compaction
    replaces the KB file (`replace`) or empties the journal (`reset`): the real code, paused at that call."""
    store = KBStore.open(kb, compact_min_bytes=0, compact_fraction=0.0)  # every transaction compacts

    def pause(frame: FrameType, event: str, arg: Any) -> None:
        at_replace = event == "c_call" and arg is os.replace and frame.f_globals["__name__"].endswith("store_disk")
        at_reset = event == "call" and frame.f_code is journal.reset.__code__
        if (at_replace and step == "replace") or (at_reset and step == "reset"):
            sys.setprofile(None)
            print("paused", flush=True)
            sys.stdin.readline()

    sys.setprofile(pause)
    put(store, "c_folder")


def verdicts(kb: str, prefix: str, n: int, threads: int) -> None:
    # imported here: the other commands need only the store
    from concurrent.futures import ThreadPoolExecutor

    from kb_mcp.tools.context import ToolContext

    ctx = ToolContext(kb, client_name=prefix)
    try:
        with ThreadPoolExecutor(threads) as pool:
            for future in [pool.submit(store_verdicts, ctx, prefix, n) for _ in range(threads)]:
                future.result()  # an exception in any thread fails the process
    finally:
        ctx.close()
    print("stored", flush=True)


def store_verdicts(ctx: object, prefix: str, n: int) -> None:
    """N verdicts (`c_<prefix>_<i>`) stored the way a verification stores its own."""
    from pathlib import Path

    from kb_mcp.harness.judgment.verdict import CompileResult, InputSetCheck, VerifyResult
    from kb_mcp.harness.problem import load_problem
    from kb_mcp.tools import compile_and_verify

    problem = load_problem(str(Path(__file__).resolve().parents[2] / "examples" / "problems" / "swish.py"))
    sets = [InputSetCheck(index=0, kind="secret", passed=True)]
    for i in range(n):
        result = VerifyResult(candidate_id=f"c_{prefix}_{i}", problem=problem.name, problem_hash="h",
                              verdict=Verdict.slower, summary="slower", compile=CompileResult(ok=True),
                              input_sets=sets, device="cpu", arch="sm_90")
        request = compile_and_verify.Request(problem=problem.source, candidate=f"# {prefix} {i}")
        compile_and_verify.record(ctx, request, problem, f"# {prefix} {i}", result)  # type: ignore[arg-type]


if __name__ == "__main__":
    if sys.argv[1] == "verdicts":
        verdicts(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif sys.argv[1] == "put":
        put(KBStore.open(sys.argv[2]), sys.argv[3])
    elif sys.argv[1] == "fold-stall":
        fold_stall(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "stall":
        stall(sys.argv[2])
    elif sys.argv[1] == "chaos":
        chaos(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "record":
        record(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "hold":
        hold(sys.argv[2])
    else:
        churn(sys.argv[2], int(sys.argv[3]))
