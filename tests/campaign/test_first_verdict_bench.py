"""bench/first_verdict_bench.py: the composed-mode candidate it writes for a problem without a
solution of ours constructs from every level-1 problem (a reference that names its own class in
`super(Model, self)` included), keeps the reference's parameters, and the problems it is asked for
must exist."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import first_verdict_bench as bench  # noqa: E402

from kb_mcp.harness.judgment.integrity_static import check_source  # noqa: E402

KERNELBENCH = Path(os.environ.get("KB_MCP_KERNELBENCH", Path(__file__).resolve().parents[3] / "shared" / "kernelbench"))
LEVEL1 = KERNELBENCH / "level1"
# Small enough to construct on CPU in a moment; each names its class in `super(Model, self)`.
SMALL = ("19_ReLU", "24_LogSoftmax", "34_InstanceNorm", "76_conv_standard_1D_dilated_strided__")


def _module(source: str, tmp_path: Path, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(not LEVEL1.is_dir(), reason=f"no KernelBench level 1 at {LEVEL1} (set KB_MCP_KERNELBENCH)")
@pytest.mark.parametrize("stem", SMALL)
def test_the_composed_candidate_constructs_as_the_reference_does(stem: str, tmp_path: Path) -> None:
    problem = next(LEVEL1.glob(f"{stem}*.py"), None)
    if problem is None:
        pytest.skip(f"{stem} is not in {LEVEL1}")
    assert "super(Model, self)" in problem.read_text()
    source, mode = bench.candidate(problem)
    if mode == "own":
        pytest.skip(f"{stem} has a solution of ours")
    assert mode == "composed"
    assert check_source(source, composed=True) == []  # the static checks find nothing to refuse
    ref_mod = _module(problem.read_text(), tmp_path, f"ref_{problem.stem}")
    cand_mod = _module(source, tmp_path, f"cand_{problem.stem}")
    init = ref_mod.get_init_inputs()
    torch.manual_seed(0)
    reference = ref_mod.Model(*init)
    torch.manual_seed(0)
    candidate = cand_mod.ModelNew(*init)
    assert candidate.kernel is None  # nothing of CUDA until its first forward
    ours = dict(candidate.inner.named_parameters())
    assert {f"{k}": v.shape for k, v in reference.named_parameters()} == {k: v.shape for k, v in ours.items()}
    assert all(torch.equal(v, ours[k]) for k, v in reference.named_parameters())


def test_a_problem_not_in_the_folder_is_the_callers_error(tmp_path: Path) -> None:
    (tmp_path / "level1").mkdir()
    with pytest.raises(SystemExit, match="no_such_problem: no such problem"):
        bench.main(["--kernelbench", str(tmp_path), "--problems", "no_such_problem"])
