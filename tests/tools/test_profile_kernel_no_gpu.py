"""profile_kernel where no GPU can be visible: it checks its inputs, then answers `needs_gpu` at once
instead of starting a profiling process (CUDA_VISIBLE_DEVICES="" hides GPUs on any machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb_mcp.harness.gpu.gpu_probe import no_gpu_reason
from kb_mcp.tools import profile_kernel
from kb_mcp.tools.base import ToolError
from kb_mcp.tools.context import ToolContext

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "examples" / "problems" / "swish.py"
CANDIDATE = ROOT / "examples" / "candidates" / "swish_nvrtc.py"


@pytest.fixture
def hidden_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    context = ToolContext(tmp_path / "kb.json", cache_dir=tmp_path / "cache")
    yield context
    context.close()


def test_the_probe_names_the_hiding_variable(hidden_gpus: None) -> None:
    assert "CUDA_VISIBLE_DEVICES" in (no_gpu_reason() or "")


def test_needs_gpu_comes_back_without_starting_anything(hidden_gpus: None, ctx: ToolContext) -> None:
    result = profile_kernel.run(ctx, profile_kernel.Request(problem=str(PROBLEM), candidate=str(CANDIDATE)))
    assert result.status == "needs_gpu" and result.profile_id is None
    assert result.candidate_id and result.candidate_id.startswith("c_") and result.problem == "swish"
    assert "CUDA_VISIBLE_DEVICES" in result.summary and "GPU" in result.next_step
    assert not ctx.profiles_dir.exists()  # nothing profiled, nothing stored
    assert "profilers" not in ctx.__dict__  # no profiling driver was started


def test_inputs_are_still_checked_without_a_gpu(hidden_gpus: None, ctx: ToolContext, tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="Model"):
        profile_kernel.run(ctx, profile_kernel.Request(problem="import torch\nx = 1\n"))
    cuda = tmp_path / "kernel.cu"
    cuda.write_text("__global__ void swish(float* x, int n) { }\n")
    with pytest.raises(ToolError, match=r"is a CUDA/C\+\+ file"):
        profile_kernel.run(ctx, profile_kernel.Request(problem=str(PROBLEM), candidate=str(cuda)))


def test_a_missing_path_says_to_send_the_text(ctx: ToolContext, tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="send the file's text as `problem`"):
        profile_kernel.run(ctx, profile_kernel.Request(problem=str(tmp_path / "elsewhere.py")))
