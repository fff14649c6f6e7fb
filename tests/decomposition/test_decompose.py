"""Decomposing a model whose forward runs the same computation on the same tensors at several places
(an RNN cell unrolled over its steps): those places share one part file, which says so, the ranking
lists the file once with its shares summed, and the model recomposed from its parts is exact."""

from __future__ import annotations

from pathlib import Path

from kb_mcp.decomposition import decompose, runner

RNN = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, steps: int = 4):
        super().__init__()
        self.steps = steps
        self.cell = nn.Linear(64, 64)
        self.head = nn.Linear(64, 16)

    def forward(self, x):
        h = x
        for _ in range(self.steps):
            h = torch.tanh(self.cell(h))
            h = h * 0.5
        return self.head(h)


def get_inputs():
    return [torch.randn(8, 64)]


def get_init_inputs():
    return [4]
'''


def test_an_unrolled_cell_is_one_part_file_for_all_its_steps(tmp_path: Path) -> None:
    (result,) = decompose.decompose_many([("toy_rnn", RNN)])
    assert not isinstance(result, Exception), result
    decomp, files = result
    cells = [p for p in decomp.parts if "cell" in p.modules]
    assert len(cells) == 4
    first = cells[0]
    assert first.same_as is None and all(p.same_as == first.name and p.file == first.file for p in cells[1:])
    part_files = [f for f in files if f.startswith("parts/")]
    assert len(part_files) == len({p.file for p in decomp.parts}) < len(decomp.parts)
    text = files[first.file]
    assert f"{len(cells)} times" in text and "one verdict on it serves each of them" in text

    ranked = decomp.by_file()
    assert [p.name for p, _, _ in ranked].count(first.name) == 1
    (_, share, others), = [(p, s, o) for p, s, o in ranked if p.name == first.name]
    assert others == [p.name for p in cells[1:]]
    assert abs(share - sum(p.share for p in cells)) < 1e-9 and abs(sum(s for _, s, _ in ranked) - 1.0) < 1e-6

    (check,) = runner.run("check", [{"source": RNN, "composed": files[decompose.REFERENCE], "batch": None,
                                     "shrink": False}])
    assert check.get("exact"), check


STEPS = (Path(__file__).parent / "steps_model.py").read_text()


def test_a_layer_run_over_an_inputs_steps_in_several_files_is_listed_as_one(tmp_path: Path) -> None:
    """Each step's part picks its own piece of x, so the steps are not one file; `by_layer` still says
    the output layer runs at every step and what share all its places take."""
    (result,) = decompose.decompose_many([("toy_steps", STEPS)])
    assert not isinstance(result, Exception), result
    decomp, _ = result
    layers = decomp.by_layer()
    h2o = [(heads, share, places) for heads, share, places in layers if "h2o.weight" in heads[0].parameters]
    assert len(h2o) == 1
    heads, share, places = h2o[0]
    runs = [p for p in decomp.parts if "h2o.weight" in p.parameters]
    assert places == len(runs) == 5 and len(heads) == len({p.file for p in runs}) > 1
    assert abs(share - sum(p.share for p in runs)) < 1e-9
    assert all(len(hs) > 1 for hs, _, _ in layers)  # a layer in one file is `by_file`'s, not listed here
    (plain,) = decompose.decompose_many([("toy_rnn", RNN)])
    assert not isinstance(plain, Exception) and plain[0].by_layer() == []  # each layer one file already


DERIVED_BUFFERS = (Path(__file__).parent / "derived_buffer_model.py").read_text()
AUTOCAST = (Path(__file__).parent / "autocast_model.py").read_text()


def test_a_tensor_the_forward_derives_from_buffers_is_refused_not_written_as_zeros() -> None:
    """fx computes `torch.sqrt(self.running_var + eps)` and `~self.mask` while it traces, on meta
    tensors: a part holding them as zeros divides by zero. The decomposition says it is its own limit
    and how the model's author gets around it; registering the derived tensors as buffers does."""
    (result,) = decompose.decompose_many([("derived_buffers", DERIVED_BUFFERS)])
    assert isinstance(result, decompose.TracerLimit), result
    assert result.whose == "kb-mcp" and "_tensor_constant" in str(result) and "not a fault of the model" in str(result)
    assert result.action and "register_buffer" in result.action

    registered = DERIVED_BUFFERS.replace(
        'self.register_buffer("running_var", torch.linspace(0.5, 2.0, d))',
        'self.register_buffer("inv_std", torch.rsqrt(torch.linspace(0.5, 2.0, d) + 1e-5))').replace(
        "/ torch.sqrt(self.running_var + 1e-5)", "* self.inv_std").replace(
        '"mask", torch.tril(torch.ones(t, t)).bool()', '"blocked", ~torch.tril(torch.ones(t, t)).bool()').replace(
        "~self.mask", "self.blocked")
    assert registered.count("inv_std") == 2 and registered.count("blocked") == 2
    (fixed,) = decompose.decompose_many([("registered_buffers", registered)])
    assert not isinstance(fixed, Exception), fixed
    (check,) = runner.run("check", [{"source": registered, "composed": fixed[1][decompose.REFERENCE], "batch": None,
                                     "shrink": False}])
    assert check.get("exact"), check


def test_a_model_that_enters_autocast_is_refused_as_the_traces_limit() -> None:
    """A traced graph keeps no autocast region: its parts would run the region's ops at the outer dtype."""
    (result,) = decompose.decompose_many([("autocast", AUTOCAST)])
    assert isinstance(result, decompose.TracerLimit), result
    assert result.whose == "kb-mcp" and "autocast" in str(result) and result.action
    region = 'with torch.autocast(device_type="cpu", dtype=torch.bfloat16):'
    assert region in AUTOCAST and not decompose.enters_autocast(AUTOCAST.replace(region, "with torch.no_grad():"))
