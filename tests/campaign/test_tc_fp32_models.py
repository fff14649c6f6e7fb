"""The level-3 model solutions on the strict-fp32 tensor-core kernels (bench/kernelbench_solutions/
fp32_tc_models, written by bench/tc_fp32_sync.py through bench/tc_fp32_models.py): each is one
self-contained candidate with the reference's parameters, its CUDA compiles for sm_90a with no spills,
and on a GPU its output is the reference's at float32 accuracy."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "bench" / "kernelbench_solutions" / "fp32_tc_models"
KERNELBENCH = Path(os.environ.get("KB_MCP_KERNELBENCH", ROOT.parent / "shared" / "kernelbench"))
BENCH = ROOT / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from tc_fp32_models import COMMON, MODELS, expected_model_files  # noqa: E402

from kb_mcp.harness.judgment.integrity_static import check_source  # noqa: E402

SOLUTIONS = sorted(FOLDER.rglob("*.py"))


def _consts(path: Path) -> dict[str, Any]:
    tree = ast.parse(path.read_text())
    return {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
            for t in n.targets if isinstance(t, ast.Name)}


def _without_build(path: Path) -> ModuleType:
    """The solution's module with its `_ext = load_inline(...)` line left out: its classes, without a build."""
    tree = ast.parse(path.read_text())
    tree.body = [n for n in tree.body if not (isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "_ext" for t in n.targets))]
    module = ModuleType(path.stem)
    exec(compile(tree, str(path), "exec"), module.__dict__)  # our own shipped file
    return module


def _reference(problem: str) -> ModuleType:
    path = KERNELBENCH / problem
    if not path.is_file():
        pytest.skip(f"no KernelBench checkout at {KERNELBENCH} (set KB_MCP_KERNELBENCH)")
    return _load(path, "ref")


def _load(path: Path, prefix: str = "solution") -> ModuleType:
    """The module of a file (a solution's import builds its extension)."""
    spec = importlib.util.spec_from_file_location(f"{prefix}_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generator_writes_one_file_per_model_and_nothing_else(tmp_path: Path) -> None:
    assert sorted(expected_model_files()) == SOLUTIONS  # the shipped folder holds exactly the generated files
    proc = subprocess.run([sys.executable, str(BENCH / "tc_fp32_sync.py"), "--out", str(tmp_path / "tc"),
                           "--models-out", str(tmp_path / "models")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    written = tmp_path / "models" / MODELS[0].path
    assert written.read_text() == (FOLDER / MODELS[0].path).read_text()
    written.write_text(written.read_text().replace("RA_BM 64", "RA_BM 32"))
    proc = subprocess.run([sys.executable, str(BENCH / "tc_fp32_sync.py"), "--check", "--out", str(tmp_path / "tc"),
                           "--models-out", str(tmp_path / "models")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and MODELS[0].path.split("/")[1] in proc.stdout


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_each_model_solution_is_one_self_contained_candidate(path: Path) -> None:
    tree = ast.parse(path.read_text())
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    assert "ModelNew" in classes and "Model" not in classes
    imports = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assert imports <= {"math", "torch", "torch.nn", "load_inline"}, imports
    consts = _consts(path)
    sol = next(s for s in MODELS if (FOLDER / s.path) == path)
    assert ("wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32" in consts["CUDA"]) == sol.gemm
    for name in (COMMON, *sol.kernels) if sol.kernels else ():  # each file and its C++ wrappers whole
        assert (BENCH / "tc_fp32" / name).read_text() in consts["CUDA"]
        wrappers = (BENCH / "tc_fp32" / name).with_suffix(".cpp")
        assert not wrappers.is_file() or wrappers.read_text() in consts["CPP"]
    for fn, _ in sol.binds:
        assert f'm.def("{fn}", &{fn}' in consts["CPP"]


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_each_model_solution_passes_the_static_checks_in_own_mode(path: Path) -> None:
    # own mode, the stricter: every op of the forward path a kernel of our own (data moves by the copy engine)
    assert check_source(path.read_text()) == []


# Small constructor arguments per model: its parameters' names, shapes and seeded values are what matter.
SMALL_ARGS: dict[str, list[Any]] = {
    "1_MLP": [64, [96, 128], 32], "2_ShallowWideMLP": [64, [96, 96], 32], "3_DeepNarrowMLP": [64, [32] * 4, 16],
    "33_VanillaRNN": [48, 64, 32], "50_ReLUSelfAttention": [96, 3, 128], "31_VisionAttention": [64, 2],
    "4_LeNet5": [10], "17_SqueezeNetFireModule": [3, 6, 64, 64], "11_VGG16": [10], "12_VGG19": [10],
    "5_AlexNet": [10], "13_DenseNet121TransitionLayer": [32, 64],
    "6_GoogleNetInceptionModule": [32, 16, 8, 24, 4, 8, 8], "34_VanillaRNNHidden": [64, 256, 32],
    "46_NetVladWithGhostClusters": [32, 512, 16], "47_NetVladNoGhostClusters": [32, 512, 0],
}


def test_every_model_solution_has_its_small_arguments() -> None:
    assert set(SMALL_ARGS) == {p.stem for p in SOLUTIONS}


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_each_model_solution_holds_the_references_parameters(path: Path) -> None:
    ref = _reference(f"level3/{path.name}")
    new = _without_build(path)
    torch.manual_seed(7)
    r = ref.Model(*SMALL_ARGS[path.stem])
    torch.manual_seed(7)
    n = new.ModelNew(*SMALL_ARGS[path.stem])
    rs, ns = r.state_dict(), n.state_dict()
    assert list(rs) == list(ns)
    assert all(torch.equal(rs[k], ns[k]) for k in rs)
    if hasattr(r, "hidden"):  # the RNN's state drawn before its layers, the same
        assert torch.equal(r.hidden, n.hidden)


@pytest.mark.nvcc
@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_each_model_solution_compiles_for_sm90a_without_spills(path: Path, tmp_path: Path) -> None:
    cu = tmp_path / "solution.cu"
    cu.write_text(_consts(path)["CUDA"])
    proc = subprocess.run(["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-std=c++17", "-c", "-Xptxas",
                           "-v", str(cu), "-o", str(tmp_path / "solution.o")], capture_output=True, text=True,
                          timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    kernels = re.findall(r"Compiling entry function '(\w+)'", log)
    assert "relu_attention_3xtf32" in kernels or "relu_attention" not in path.stem.lower(), kernels
    assert len(re.findall(r"Used (\d+) registers", log)) == len(kernels)
    assert all(int(a) == 0 and int(b) == 0 for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads",
                                                                   log)), log
    assert "warning" not in log.lower(), log


@pytest.fixture(scope="module")
def built() -> None:
    """Every solution's extension built first, side by side in processes of their own (torch's extension
    cache then serves each test's import): one after another they would take minutes."""
    procs = [subprocess.Popen([sys.executable, "-c", "import importlib.util, sys; "
                               "spec = importlib.util.spec_from_file_location('s', sys.argv[1]); "
                               "spec.loader.exec_module(importlib.util.module_from_spec(spec))", str(path)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for path in SOLUTIONS]
    failed = []
    for path, proc in zip(SOLUTIONS, procs):
        out, _ = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            failed.append(f"{path.name}: {out[-2000:]}")
    assert not failed, "\n".join(failed)


def _against_float64(ref: Any, new: Any, xs: list[torch.Tensor]) -> tuple[float, float, float]:
    """(our error, strict float32's error, the output's largest magnitude) against float64, on `xs`."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        ours = new(*[x.clone() for x in xs])
        strict = ref(*[x.clone() for x in xs])
        ref.double()
        if hasattr(ref, "hidden"):
            ref.hidden = ref.hidden.double()
        exact = ref(*[x.double() for x in xs])
        ref.float()
    err_ours = (ours.double() - exact).abs().max().item()
    err_ref = (strict.double() - exact).abs().max().item()
    return err_ours, err_ref, exact.abs().max().item()


@pytest.mark.gpu
@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_on_a_gpu_each_model_solution_is_its_reference_at_float32_accuracy(path: Path, built: None) -> None:
    """At the problem's real sizes, against float64: our error at most twice strict float32's."""
    ref_mod = _reference(f"level3/{path.name}")
    sol = _load(path)
    torch.manual_seed(0)
    ref = ref_mod.Model(*ref_mod.get_init_inputs()).cuda().eval()  # as the harness runs both
    torch.manual_seed(0)
    new = sol.ModelNew(*ref_mod.get_init_inputs()).cuda().eval()
    new.load_state_dict(ref.state_dict())
    xs = [x.cuda() for x in ref_mod.get_inputs()]
    err_ours, err_ref, scale = _against_float64(ref, new, xs)
    assert err_ours <= 2 * err_ref + 1e-6 * scale, (err_ours, err_ref, scale)


@pytest.mark.gpu
def test_on_a_gpu_the_relu_attention_kernel_holds_over_its_shapes_and_signed_inputs(built: None) -> None:
    """Several row blocks, the diagonal, one head or many, inputs of both signs."""
    ref_mod = _reference("level3/50_ReLUSelfAttention.py")
    sol = _load(FOLDER / "level3" / "50_ReLUSelfAttention.py")
    for (b, t, c, h), signed in (((2, 256, 768, 12), False), ((1, 512, 128, 2), True), ((3, 64, 64, 1), True)):
        torch.manual_seed(0)
        ref = ref_mod.Model(c, h, t).cuda().eval()
        new = sol.ModelNew(c, h, t).cuda().eval()
        new.load_state_dict(ref.state_dict())
        x = torch.rand(b, t, c, device="cuda")
        err_ours, err_ref, scale = _against_float64(ref, new, [x * 2 - 1 if signed else x])
        assert err_ours <= 2 * err_ref + 1e-6 * scale, (b, t, c, h, err_ours, err_ref, scale)
