"""A problem's footprint read on the meta device (`harness.worker.footprint`), and the chunked values
the checks compare with (`harness.worker.values`): CPU tensors, the same code as on the GPU."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
import torch

from kb_mcp.harness.worker import values
from kb_mcp.harness.worker.footprint import measure
from kb_mcp.harness.worker.values import all_finite, compare, digest, poison_count, same

ROOT = Path(__file__).resolve().parents[2]


def load(tmp_path: Path, source: str, name: str = "fp_problem") -> ModuleType:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules.pop(name, None)
    return module


GEMM = """
    import torch
    import torch.nn as nn

    M, K, N = 8192, 4096, 2048

    class Model(nn.Module):
        def __init__(self, k, n):
            super().__init__()
            self.linear = nn.Linear(k, n)

        def forward(self, x):
            return torch.relu(self.linear(x))

    def get_inputs():
        return [torch.rand(M, K)]

    def get_init_inputs():
        return [K, N]
"""


def test_a_gemm_problem_is_sized_without_allocating_it(tmp_path: Path) -> None:
    fp = measure(load(tmp_path, GEMM))
    assert fp.method == "meta" and fp.note == ""
    assert fp.input_bytes == 8192 * 4096 * 4
    assert fp.output_bytes == 8192 * 2048 * 4
    assert fp.param_bytes == (4096 * 2048 + 2048) * 4
    assert fp.flops == pytest.approx(2 * 8192 * 4096 * 2048)
    assert fp.dtypes == ["float32"] and fp.dtype == "float32"
    assert fp.eager_peak_bytes is None  # measured on the GPU, in the first check


def test_a_problem_of_many_gigabytes_costs_no_memory(tmp_path: Path) -> None:
    huge = GEMM.replace("M, K, N = 8192, 4096, 2048", "M, K, N = 1 << 20, 8192, 8192")  # 32 GiB of input
    fp = measure(load(tmp_path, huge))
    assert fp.input_bytes == (1 << 20) * 8192 * 4 and fp.method == "meta"


def test_a_forward_without_a_meta_implementation_is_left_to_the_gpu(tmp_path: Path) -> None:
    src = GEMM.replace("return torch.relu(self.linear(x))", "return self.linear(x) * float(x.sum().item())")
    fp = measure(load(tmp_path, src))
    assert fp.method == "device" and "item" in fp.note
    assert fp.input_bytes == 8192 * 4096 * 4 and fp.param_bytes > 0
    assert fp.output_bytes == 0  # measured by the first check


def test_a_problem_whose_inputs_fail_on_the_meta_device_is_sized_on_the_gpu(tmp_path: Path) -> None:
    src = GEMM.replace("return [torch.rand(M, K)]", "raise ValueError('no inputs here')")
    fp = measure(load(tmp_path, src))
    assert fp.method == "device" and "ValueError" in fp.note and fp.input_bytes == 0


@pytest.mark.parametrize("path", sorted((ROOT / "examples" / "problems").glob("*.py")), ids=lambda p: p.stem)
def test_every_example_problem_is_sized_on_the_meta_device(path: Path) -> None:
    spec = importlib.util.spec_from_file_location(f"fp_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fp = measure(module)
    torch.manual_seed(0)
    xs = module.get_inputs()
    expected = sum(x.numel() * x.element_size() for x in xs if isinstance(x, torch.Tensor))
    assert fp.method == "meta", fp.note
    assert fp.input_bytes == expected and fp.output_bytes > 0


# -- chunked values ---------------------------------------------------------------------------


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 1000 elements: the chunked paths run on tensors a test can afford."""
    monkeypatch.setattr(values, "CHUNK_ELEMENTS", 1000)


@pytest.mark.parametrize("case", ["close", "far", "nan", "inf_ref", "poison", "constant", "int", "bf16"])
def test_a_chunked_comparison_says_what_the_whole_one_says(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(3)
    r = torch.randn(10_007) * 2.0
    c = r + 1e-6 * torch.randn_like(r)
    if case == "far":
        c[1234] += 1.0
        c[9000] -= 3.0
    elif case == "nan":
        c[5] = float("nan")
    elif case == "inf_ref":
        r[7000] = c[7000] = float("inf")
        c[10] += 1.0
    elif case == "poison":
        c.view(torch.uint8)[4 * 2000: 4 * 2010] = values.POISON_BYTE
    elif case == "constant":
        c = torch.zeros_like(r)
    elif case == "int":
        r = torch.randint(0, 100, (10_007,))
        c = r.clone()
        c[4321] = -1
    elif case == "bf16":
        r, c = r.bfloat16(), c.bfloat16()
    whole = compare(c, r, 1e-4, 1e-4)
    monkeypatch.setattr(values, "CHUNK_ELEMENTS", 1000)
    chunked = compare(c, r, 1e-4, 1e-4)
    assert chunked.passed == whole.passed and chunked.mismatched == whole.mismatched
    assert chunked.nonfinite == whole.nonfinite and chunked.poison == whole.poison
    assert chunked.constant == whole.constant
    for a, b in ((chunked.max_abs, whole.max_abs), (chunked.max_rel, whole.max_rel), (chunked.scaled, whole.scaled)):
        assert (a is None) == (b is None) and (a is None or a == pytest.approx(b, rel=1e-5))
    quick = compare(c, r, 1e-4, 1e-4, detail=False)
    assert quick.passed == whole.passed and (quick.passed or quick.message == chunked.message)


def test_same_compares_with_a_copy_kept_on_the_host(small_chunks: None) -> None:
    x = torch.randn(5003)
    host = x.clone()
    assert same(x, host)
    x[4999] += 1.0
    assert not same(x, host)
    nan = torch.full((3000,), float("nan"))
    assert same(nan, nan.clone())  # NaN where both are NaN is the same value


def test_a_digest_tells_apart_outputs_that_differ_in_one_bit(small_chunks: None) -> None:
    x = torch.randn(4097)
    y = x.clone()
    assert digest(x) == digest(y)
    y.view(torch.int32)[4000] ^= 1
    assert digest(x) != digest(y)
    assert digest(x) != digest(x[:-1])  # another shape
    assert digest(torch.zeros(8, dtype=torch.float16)) != digest(torch.zeros(4, dtype=torch.float32))


@pytest.mark.parametrize(("p", "q"), [(0, 1), (5, 4000), (1023, 1024), (17, 3999)])
def test_two_words_changed_so_that_one_sum_stays_still_change_the_digest(small_chunks: None, p: int, q: int) -> None:
    """Word i weighs 2i+1 in the first sum: changes of +(2q+1) at p and -(2p+1) at q leave it as it
    was (over several chunks); the second sum, by the squares, tells them apart."""
    x = torch.randint(-1000, 1000, (4096,), dtype=torch.int32)
    y = x.clone()
    y[p] += 2 * q + 1
    y[q] -= 2 * p + 1
    kind, first, second = digest(x)
    assert digest(y)[:2] == (kind, first) and digest(y)[2] != second


def test_finite_and_poison_counts_run_over_chunks(small_chunks: None) -> None:
    x = torch.randn(3500)
    assert all_finite(x)
    x[3400] = float("inf")
    assert not all_finite(x)
    x.view(torch.uint8)[4 * 2500: 4 * 2600] = values.POISON_BYTE
    assert poison_count(x) == 100
