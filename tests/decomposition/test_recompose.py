"""Every level-3 model decomposed into parts and recomposed from the reference's own part files
reproduces the model's output bit for bit (real numbers, the same weights and inputs, at batch 1;
models whose parameters would take long to build for real with their sizes divided, "auto")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kb_mcp.decomposition import decompose, runner

# A KernelBench checkout beside the repository, or $KB_MCP_KERNELBENCH (as tests/campaign/test_selection.py)
LEVEL3 = Path(os.environ.get("KB_MCP_KERNELBENCH", Path(__file__).resolve().parents[3] / "shared" / "kernelbench")) \
    / "level3"

pytestmark = pytest.mark.skipif(not LEVEL3.is_dir(), reason=f"KernelBench level 3 not at {LEVEL3}")


@pytest.mark.slow
def test_every_level3_model_recomposes_exactly(tmp_path: Path) -> None:
    problems = [(p.stem, p.read_text()) for p in sorted(LEVEL3.glob("*.py"))]
    assert len(problems) >= 44
    results = decompose.decompose_many(problems, batch=1, jobs=2, shrink="auto")
    failed = {name: str(r) for (name, _), r in zip(problems, results) if isinstance(r, decompose.DecompositionError)}
    assert not failed, failed
    entries, names = [], []
    for (name, source), result in zip(problems, results):
        assert not isinstance(result, Exception)
        decomp, files = result
        assert decomp.parts and all(f"{p.file}" in files for p in decomp.parts)
        assert abs(sum(p.share for p in decomp.parts) - 1.0) < 1e-6
        entries.append({"source": source, "composed": files[decompose.REFERENCE], "batch": 1,
                        "shrink": decomp.shrunk})
        names.append(name)
    costs = [float(sum(len(p.nodes) for p in r[0].parts)) for r in results if not isinstance(r, Exception)]
    checks = runner.run("check", entries, jobs=2, costs=costs)  # the large graphs spread over both processes
    wrong = {n: c.get("error") or f"max |diff| {c.get('max_abs_diff')}" for n, c in zip(names, checks)
             if not c.get("exact")}
    assert not wrong, wrong
    methods = {d.method for r in results if not isinstance(r, Exception) for d in [r[0]]}
    assert "fx" in methods and "export" in methods  # both tracers were needed
