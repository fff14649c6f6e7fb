"""Constructor texts of torch.nn modules, as part files write them: only what differs from the
defaults, and a text that builds the same module (repr and state shapes) or none."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kb_mcp.harness.worker.decompose_graph import constructor


@pytest.mark.parametrize(("module", "text"), [
    (nn.Conv2d(3, 64, 3, padding=1), "nn.Conv2d(in_channels=3, out_channels=64, kernel_size=(3, 3), padding=(1, 1))"),
    (nn.BatchNorm2d(64), "nn.BatchNorm2d(num_features=64)"),
    (nn.Linear(10, 20, bias=False), "nn.Linear(in_features=10, out_features=20, bias=False)"),
    (nn.LSTM(10, 20, 2, batch_first=True), "nn.LSTM(input_size=10, hidden_size=20, num_layers=2, batch_first=True)"),
    (nn.ReLU(inplace=True), "nn.ReLU(inplace=True)"),
    (nn.MaxPool2d(2), "nn.MaxPool2d(kernel_size=2, stride=2)"),
])
def test_only_what_differs_from_the_defaults_is_written(module: nn.Module, text: str) -> None:
    assert constructor(module) == text


@pytest.mark.parametrize("module", [
    nn.Conv2d(3, 8, 3, stride=2, groups=1, bias=False), nn.GRU(8, 16, bidirectional=True), nn.LayerNorm(32, eps=1e-6),
    nn.MultiheadAttention(64, 4, batch_first=True), nn.Embedding(100, 16, padding_idx=0)])
def test_each_text_builds_the_same_module(module: nn.Module) -> None:
    text = constructor(module)
    assert text is not None
    made = eval(text, {"nn": nn})  # our own text
    assert repr(made) == repr(module)
    assert {k: v.shape for k, v in made.state_dict().items()} == {k: v.shape for k, v in module.state_dict().items()}


def test_a_module_of_another_dtype_keeps_it() -> None:
    text = constructor(nn.Linear(4, 4).to(torch.float16))
    assert text is not None and text.endswith(".to(torch.float16)")


def test_a_module_outside_torch_nn_has_no_text() -> None:
    class Mine(nn.Module):
        pass

    assert constructor(Mine()) is None
