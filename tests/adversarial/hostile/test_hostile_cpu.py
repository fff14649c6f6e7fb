"""Hostile candidates on the CPU paths: each is stopped, and the server's world stays byte-identical.

Two paths run without a GPU. The compile-only path (`WorkerPool.verify` here) never runs the
candidate: it reads the sources statically and compiles them in the sandbox, refusing flags and
includes outside the allow-lists. The census worker does run it (import, constructor, forward,
on CPU tensors) in its sandbox: every attack that runs at import is run there for real. The GPU
path (the verify worker, the profiling driver) is tests/adversarial/hostile/test_hostile_gpu.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hostile_world import CASES, RUNS_AT_IMPORT, TRIED, ServerWorld, protection

from kb_mcp.harness.builds.compile_only import CompileOnly
from kb_mcp.harness.builds.toolchain import CompilerRun
from kb_mcp.harness.candidate import SourceUnit
from kb_mcp.harness.judgment.verdict import Finding, FindingCode
from kb_mcp.harness.pool.pool import WorkerPool
from kb_mcp.harness.problem import load_problem
from kb_mcp.harness.sandbox.sandbox import Sandbox
from kb_mcp.kb.models import Verdict

ROOT = Path(__file__).resolve().parents[3]
SWISH = load_problem(ROOT / "examples" / "problems" / "swish.py")


@pytest.fixture(scope="module")
def pool(world: ServerWorld, world_sandbox: Sandbox) -> Iterator[WorkerPool]:
    with WorkerPool(world.cache, no_cuda=True, spare=False, sandbox=world_sandbox) as p:
        yield p


def test_every_hostile_file_names_what_stops_it() -> None:
    assert len(CASES) >= 10
    for name in CASES:
        assert len(protection(name)) > 40, name


@pytest.mark.nvcc
@pytest.mark.parametrize("name", CASES)
def test_compile_only_never_runs_it(pool: WorkerPool, world: ServerWorld, name: str) -> None:
    before = world.snapshot()
    result = pool.verify(SWISH, world.render(name))
    assert result.verdict in (Verdict.needs_gpu, Verdict.compile_error, Verdict.invalid), result.summary
    assert result.output == "" and result.phase == "compile"  # nothing of it ran
    world.assert_untouched(before, result.model_dump_json())


@pytest.mark.parametrize("name", RUNS_AT_IMPORT)
def test_run_in_the_sandbox_it_changes_nothing(pool: WorkerPool, world: ServerWorld, name: str) -> None:
    """The census worker imports, constructs and runs the candidate: the attack runs, confined."""
    before = world.snapshot()
    reply = pool.census(SWISH, world.render(name))
    census = pool._census
    output = census.output.take(200_000) if census is not None else ""
    world.assert_untouched(before, reply.model_dump_json(), output)
    attempts = [f.message for f in reply.findings if f.code == FindingCode.sandbox_attempt]
    assert len(attempts) == 1, reply.findings
    for tried in TRIED[name]:
        assert tried in attempts[0], attempts[0]
    if name == "read_secrets.py":
        assert reply.verdict == Verdict.crashed and "LOOT" in reply.summary  # it ran, and found nothing
    else:  # import, constructor and forward all ran (the attack with them)
        assert reply.verdict is None, reply.summary
    if name == "cpp_static_constructor.py":
        # The constructor ran, inside the census worker's sandbox (its home is the scratch folder).
        assert census is not None and (census.scratch / "ctor-ran").read_text() == "ran"
    if name == "subprocess_spellings.py":
        assert census is not None and (census.scratch / "spelled").is_file()  # the commands did run


def attempt_of(findings: list[Finding]) -> str:
    """The one `sandbox_attempt` finding's message."""
    found = [f.message for f in findings if f.code == FindingCode.sandbox_attempt]
    assert len(found) == 1, findings
    return found[0]


@pytest.mark.nvcc
def test_flag_and_include_tricks_are_refused_by_name(pool: WorkerPool, world: ServerWorld) -> None:
    """Refused before any compiler runs, and recorded as attempts: the verdict says what was tried."""
    flags = pool.verify(SWISH, world.render("compiler_flag_tricks.py"))
    assert flags.verdict == Verdict.compile_error and flags.flagged
    text = "\n".join(u.log for u in flags.compile.units)
    for flag in ("-wrapper", "-include", "-fplugin=/tmp/evil.so"):
        assert flag in text, text
    tried = attempt_of(flags.findings)
    for what in ("build: hostile_flags: CUDA compiler flag -wrapper; CUDA compiler flag /bin/sh,-c,touch",
                 "host compiler flag -fplugin=/tmp/evil.so", ".ssh/id_rsa", "(compiler)",
                 "build: hostile_flags_dead: "):
        assert what in tried, tried
    includes = pool.verify(SWISH, world.render("include_tricks.py"))
    assert includes.verdict == Verdict.compile_error and includes.flagged
    text = "\n".join(u.log for u in includes.compile.units)
    assert "an absolute path" in text and "(..)" in text and "computed" in text and ".incbin" in text, text
    tried = attempt_of(includes.findings)
    for what in ("build: a: #include \"", ".ssh/id_rsa\" (cuda_sources)", "build: b: #include \"../../../../..",
                 "build: hostile_include: #include SECRET (computed, cuda_sources)",
                 "build: hostile_incbin: assembler __asm__(\".section .rodata\\n.incbin",
                 "build: hostile_dependency: #pragma GCC dependency \""):
        assert what in tried, tried
    world.assert_untouched(world.snapshot(), flags.model_dump_json(), includes.model_dump_json())


HONEST_MISTAKE = """
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA = "__global__ void k(float* x) { x[threadIdx.x] *= 2.f; }\\nvoid launch(float* x) { k<<<1, 32>>>(x); }\\n"
_ext = load_inline(name="honest_keep", cpp_sources="void launch(float* x);", cuda_sources=CUDA,
                   extra_cuda_cflags=["-keep", "--expt-relaxed-constexpr"], extra_cflags=["-funroll-all-loops"])


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)
"""


@pytest.mark.nvcc
def test_an_allow_list_refusal_of_an_honest_mistake_is_no_attempt(pool: WorkerPool) -> None:
    """Flags merely missing from the allow-lists (they reach nothing) are refused without a finding."""
    result = pool.verify(SWISH, HONEST_MISTAKE)
    text = "\n".join(u.log for u in result.compile.units)
    assert result.verdict == Verdict.compile_error and "'-keep' is not allowed" in text, text
    assert "'-funroll-all-loops' is not allowed" in text, text
    assert not [f for f in result.findings if f.code == FindingCode.sandbox_attempt] and not result.flagged


def test_a_refused_build_asked_at_run_time_is_refused_too(pool: WorkerPool, world: ServerWorld) -> None:
    """load_inline called from running code (the census worker) goes to the build service, which
    applies the same allow-lists, and records what reached outside as the census's attempts."""
    before = world.snapshot()
    reply = pool.census(SWISH, world.render("compiler_flag_tricks.py"))
    assert reply.verdict == Verdict.crashed and "not allowed" in reply.summary, reply.summary
    tried = attempt_of(reply.findings)
    assert "CUDA compiler flag -wrapper" in tried and "(build)" in tried, tried
    world.assert_untouched(before, reply.model_dump_json())


@pytest.mark.nvcc
def test_the_sandbox_stops_what_the_allow_list_would_miss(world: ServerWorld, world_sandbox: Sandbox,
                                                          tmp_path: Path) -> None:
    """Beneath the allow-lists: nvcc given `-wrapper` and an absolute `#include` directly, in the
    sandbox. The wrapper's shell runs, as nobody, and cannot reach the marker; the file is absent."""
    before = world.snapshot()
    compiler = CompileOnly(tmp_path, world_sandbox)
    runs = [
        CompilerRun(label="nvcc", filename="k.cu", text="__global__ void k() {}\n",
                    argv=("nvcc", "-wrapper", f"/bin/sh,-c,touch {world.marker}; touch $HOME/wrapped",
                          "-c", "k.cu", "-o", "k.o")),
        CompilerRun(label="nvcc", filename="i.cu", text=f'#include "{world.home}/.ssh/id_rsa"\n',
                    argv=("nvcc", "-c", "i.cu", "-o", "i.o")),
    ]
    (_rc_wrap, log_wrap, _), (rc_inc, log_inc, _) = compiler._run_all(runs, 300)  # (rc, log, SASS precisions)
    assert rc_inc != 0 and "No such file" in log_inc, log_inc
    world.assert_untouched(before, log_wrap, log_inc)


def test_the_build_process_never_loads_what_it_builds(tmp_path: Path) -> None:
    """A static constructor is compiled and linked by the build process, never run by it."""
    from kb_mcp.harness.worker.build import build_unit

    marker = tmp_path / "constructor-ran"
    cpp = ('#include <fstream>\nstatic int ran = [] { std::ofstream("' + str(marker) + '") << "ran"; return 0; }();\n'
           'extern "C" int kbmcp_ran() { return ran; }\n')
    unit = SourceUnit(kind="load_inline", name="ctor_check", cpp_source=cpp, implicit_headers=False,
                      python_module=False)
    report = build_unit(unit, "sm_90", tmp_path / "out")
    assert report.ok, report.log
    assert Path(report.so_path).is_file() and not marker.exists()
