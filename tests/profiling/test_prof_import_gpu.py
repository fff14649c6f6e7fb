"""profile_kernel on a `.ncu-rep` recorded outside the project (`ncu --set full`), read through NVIDIA's
`ncu_report` module (in the sandbox) on a machine with Nsight Compute. Run with scripts/gpu-check.sh tests/profiling."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from prof_fixtures import ROOT

from kb_mcp.harness.sandbox.sandbox import detect
from kb_mcp.profiling import ncu_import, ncu_parse, profiler
from kb_mcp.tools import classify_state, profile_kernel
from kb_mcp.tools.context import ToolContext

pytestmark = pytest.mark.gpu

PLANTED = ROOT / "tests" / "fixtures" / "planted"


def _record_set_full(name: str, tmp: Path) -> Path:
    """Builds a planted program and records it as a user would: plain `ncu --set full -o`."""
    ncu = profiler.find_ncu()
    assert ncu, "the GPU machine must have ncu"
    exe = tmp / name
    subprocess.run(["nvcc", "-O3", "-arch=sm_90", "-o", str(exe), str(PLANTED / f"{name}.cu")], check=True)
    base = tmp / f"{name}_full"
    subprocess.run([ncu, "--set", "full", "--nvtx", "--nvtx-include", "kbmcp/", "-o", str(base), "-f", str(exe)],
                   check=True, capture_output=True)
    return Path(f"{base}.ncu-rep")


def test_an_ncu_rep_reads_through_ncu_report_and_classifies(kb_path: Path, tmp_path: Path) -> None:
    report = _record_set_full("bank_conflicts", tmp_path)
    ncu = profiler.find_ncu()
    module_dir = ncu_import.find_report_module_dir(ncu)
    assert module_dir is not None, "ncu_report should be found in the Nsight Compute install's extras/python"
    ctx = ToolContext(kb_path)
    try:
        result = profile_kernel.run(ctx, profile_kernel.Request(report=str(report)))
        assert not [n for n in result.notes if "ncu_report could not read" in n], result.notes
        (k,) = result.kernels
        assert k.name == "conflicted_reads" and result.arch == "sm_90" and result.device
        assert any(f.rule == "SharedMemoryConflicts" for f in k.findings)  # findings from the CLI's details page
        state = classify_state.run(ctx, classify_state.Request(profile_id=result.profile_id))
        assert state.overall is not None and state.overall.state_id == "memory_bank_conflicts", state.overall
    finally:
        ctx.close()
    # The module's values are the CLI's base-unit export's values.
    spawner = profiler.Spawner(detect(), None, ncu)
    raw_text, _ = profiler.export_pages(ncu, report, spawner)
    (cli,) = ncu_parse.read_raw_page(raw_text)
    (mod,) = ncu_import.read_in_sandbox(spawner, module_dir, report)
    for name in ("gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
                 "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"):
        assert mod.metrics[name] == pytest.approx(cli.metrics[name], rel=1e-3, abs=0.01), name  # CLI rounds to 2 places
    assert (mod.grid, mod.block) == (cli.grid, cli.block)
