"""Builds ahead (`harness/builds/ahead.py`) with real builds in the sandbox and the real worker's builders.

The census worker runs here without a GPU and imports candidates with the worker's `load_inline`
builder installed, asking the pool's build service on a miss, exactly as the verify worker does on a
GPU. So these tests show, on any machine: an extension built ahead is found by the worker under the
name it computes itself (the pool builds nothing); the name a build ahead gives each real candidate
(the eval bench's ten solutions, the examples, calls with extra flags and positional arguments) is
the name the worker asks for; a build that fails ahead is not published and the worker's own build
then reports the compiler's error; and `stop` leaves no compiler running.

CUDA extensions cannot be built with a CPU-only torch, so the builds that must succeed here are
host-only extensions (a CPython module in C++); the name comparisons cover the CUDA candidates.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ahead_helpers import answer_candidate, descendants, gone

from kb_mcp.harness.builds.ahead import AheadOutcome, AheadTarget, BuildsAhead, default_jobs, target_for
from kb_mcp.harness.builds.builds import BuildService
from kb_mcp.harness.builds.toolchain import DEFAULT_ARCH, build_target, extension_name, light_variants
from kb_mcp.harness.candidate import SourceUnit, inline_units_ahead
from kb_mcp.harness.judgment.options import VerifyOptions
from kb_mcp.harness.pool.pool import WorkerPool
from kb_mcp.harness.protocol import BuildReply, WorkerInfo

ROOT = Path(__file__).resolve().parents[2]


def gpu_target(info: WorkerInfo) -> AheadTarget:
    """What builds ahead target on a GPU machine, for this worker's arch (none here: the default) and torch."""
    return AheadTarget(compile_only=False, arch=info.arch or DEFAULT_ARCH, torch_version=info.torch_version)


class RecordingBuilds(BuildService):
    """The pool's build service, recording what the worker asks it for. With `build` off it answers
    without building: a CUDA extension cannot be built with this machine's CPU-only torch, and what
    is compared then is the name."""

    def __init__(self, *args: object, build: bool = True) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.asked: list[tuple[SourceUnit, str, str]] = []
        self.really = build

    def build(self, unit: SourceUnit, arch: str, torch_version: str, timeout_s: float = 600.0) -> BuildReply:
        self.asked.append((unit, arch, torch_version))
        if self.really:
            return super().build(unit, arch, torch_version, timeout_s)
        return BuildReply(ok=False, refused="recorded by the test, not built")


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerPool]:
    with WorkerPool(tmp_path_factory.mktemp("ahead-cache"), no_cuda=True, spare=False) as p:
        p.builds = RecordingBuilds(p.cache_dir, p.sandbox)
        yield p


def _asked(pool: WorkerPool) -> list[tuple[SourceUnit, str, str]]:
    builds = pool.builds
    assert isinstance(builds, RecordingBuilds)
    return builds.asked


def test_an_extension_built_ahead_is_found_by_the_worker_without_a_build(pool: WorkerPool, relu_problem) -> None:
    info = pool.info()
    source = answer_candidate(42)
    ahead = BuildsAhead(pool.cache_dir, pool.sandbox, gpu_target(info))
    outcome = ahead.build(source)
    assert outcome.model_dump(exclude={"seconds"}) == {"units": 1, "built": 1, "cached": 0, "failed": 0,
                                                       "stopped": False}
    [unit] = inline_units_ahead(source)
    assert unit.cflags == ["-O2", "-DKBMCP_ANSWER=42"] and not unit.implicit_headers
    name = extension_name(unit, False, info.torch_version, build_target(DEFAULT_ARCH))
    assert ahead.service.published(name).is_file()
    before, asked = pool.builds.builds, len(_asked(pool))
    # the census worker imports the candidate with the worker's builder: found by name, loaded, called
    reply = pool.census(relu_problem, source)
    assert reply.failure is None and reply.clean, reply
    assert len(_asked(pool)) == asked and pool.builds.builds == before  # not even asked for; nothing rebuilt
    assert ahead.build(source).cached == 1  # and building it ahead again finds it too


def test_a_build_that_fails_ahead_is_not_published_and_the_worker_reports_its_own(pool: WorkerPool,
                                                                                  relu_problem) -> None:
    info = pool.info()
    source = answer_candidate(7, broken=True)
    ahead = BuildsAhead(pool.cache_dir, pool.sandbox, gpu_target(info))
    assert ahead.build(source).failed == 1
    [unit] = inline_units_ahead(source)
    assert not ahead.service.published(extension_name(unit, False, info.torch_version,
                                                      build_target(DEFAULT_ARCH))).exists()
    before, asked = pool.builds.builds, len(_asked(pool))
    reply = pool.census(relu_problem, source)
    # the worker asked, the pool built (and failed) as it would have without the build ahead
    assert len(_asked(pool)) == asked + 1 and pool.builds.builds == before + 1
    assert reply.failure is not None and "Error building extension 'kbmcp_answer'" in reply.failure.detail
    assert "expected" in reply.failure.detail  # the compiler's own words reach the candidate's account


def _names(unit: SourceUnit, torch_version: str, arch: str) -> list[str]:
    """The names the build service looks up and publishes `unit` under, for `arch`."""
    return [extension_name(unit, light, torch_version, build_target(arch)) for light in light_variants(unit)]


FLAGGED = '''
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

HEAD = "#include <cuda_runtime.h>\\n"
KERNEL = HEAD + r"""
__global__ void twice(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2.0f; }
"""
CPP = "void launch(long long x, int n);"
FLAGS = ["-O3", "-lineinfo"]
_ext = CALL


class ModelNew(nn.Module):
    def forward(self, x):
        return x
'''
CALLS = {
    "keywords_and_flags": ('load_inline(name=f"flagged_{2}", cpp_sources=[CPP, "int other();"], cuda_sources=KERNEL, '
                           'functions="launch", extra_cflags=["-O2", "-DKBMCP=1"], extra_cuda_cflags=FLAGS + ["-O2"], '
                           'extra_ldflags=["-lcudart"], with_cuda=True, verbose=True)'),
    "positional": 'load_inline("positional", CPP, KERNEL, None, ["launch"], ["-O1"], FLAGS)',
    "plain_library": ('load_inline(name="plain", cpp_sources=CPP, cuda_sources=KERNEL, is_python_module=False, '
                      'no_implicit_headers=True, with_pytorch_error_handling=False)'),
}
REAL = sorted((ROOT / "bench" / "eval_pipeline_solutions" / "level2").glob("*.py")) + sorted(
    (ROOT / "examples" / "candidates").glob("*load_inline*.py"))


@pytest.fixture(scope="module")
def recording_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerPool]:
    with WorkerPool(tmp_path_factory.mktemp("names-cache"), no_cuda=True, spare=False) as p:
        p.builds = RecordingBuilds(p.cache_dir, p.sandbox, build=False)
        yield p


@pytest.mark.parametrize("source", [p.read_text() for p in REAL] + [FLAGGED.replace("CALL", c) for c in CALLS.values()],
                         ids=[p.stem for p in REAL] + list(CALLS))
def test_a_build_ahead_names_each_real_candidate_as_the_worker_does(recording_pool: WorkerPool, relu_problem,
                                                                    source: str) -> None:
    info = recording_pool.info()
    assert len(REAL) >= 13  # the ten solutions of the eval bench and the examples: none skipped silently
    ahead = inline_units_ahead(source)
    assert len(ahead) == 1, "every real candidate's load_inline call is certain from its syntax tree"
    builds = recording_pool.builds
    assert isinstance(builds, RecordingBuilds)
    builds.asked.clear()
    recording_pool.census(relu_problem, source)  # the worker's builder reads the call it intercepts, and asks
    [(asked, arch, torch_version)] = builds.asked
    assert torch_version == info.torch_version
    target = gpu_target(info)
    assert _names(ahead[0], target.torch_version, target.arch) == _names(asked, torch_version, arch)
    assert ahead[0].model_dump(exclude={"line"}) == asked.model_dump(exclude={"line"})


def test_stop_kills_the_builds_ahead_and_publishes_nothing(pool: WorkerPool) -> None:
    """A build that takes long (torch's headers) is killed by stop: its thread returns at once and no
    compiler of it is left."""
    info = pool.info()
    source = answer_candidate(5).replace("#include <Python.h>", "#include <torch/extension.h>\n#include <Python.h>")
    ahead = BuildsAhead(pool.cache_dir, pool.sandbox, gpu_target(info))
    outcome: list[AheadOutcome] = []
    thread = threading.Thread(target=lambda: outcome.append(ahead.build(source)))
    thread.start()
    deadline = time.monotonic() + 120
    while ahead.running.alive() == 0 and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # the compilers are at work inside the sandbox
    assert ahead.running.alive() == 1 and any("kb_mcp.harness.worker.build" in c for c in descendants(os.getpid()))
    stopped_at = time.monotonic()
    ahead.stop()
    thread.join(timeout=30)
    assert not thread.is_alive() and time.monotonic() - stopped_at < 10
    [result] = outcome
    assert result.stopped and result.built == 0 and result.failed == 1
    assert gone(("kb_mcp.harness.worker.build", "cc1plus", "ninja"))
    [unit] = inline_units_ahead(source)
    assert not ahead.service.published(extension_name(unit, False, info.torch_version,
                                                      build_target(DEFAULT_ARCH))).exists()
    assert ahead.build(answer_candidate(6)).stopped  # nothing more is started


def test_the_target_follows_the_pools_rule() -> None:
    gpu = WorkerInfo(pid=1, cuda=True, arch="sm_90", torch_version="2.13.0")
    assert target_for(gpu, VerifyOptions()) == AheadTarget(compile_only=False, arch="sm_90", torch_version="2.13.0")
    assert target_for(gpu, VerifyOptions(compile_only=True, arch="sm_80")) == AheadTarget(compile_only=True,
                                                                                         arch="sm_80")
    assert target_for(WorkerInfo(pid=1), VerifyOptions()).model_dump() == {"compile_only": True, "arch": "sm_90a",
                                                                           "torch_version": ""}
    assert target_for(gpu, VerifyOptions(), no_cuda=True).compile_only


@pytest.mark.parametrize(("cpus", "gib", "jobs"), [(16, 128, 7), (2, 8, 1), (64, 16, 4), (1, 1, 1), (8, 512, 3)])
def test_default_jobs_fit_the_cores_and_the_memory(cpus: int, gib: int, jobs: int) -> None:
    assert default_jobs(cpus, gib << 30) == jobs
