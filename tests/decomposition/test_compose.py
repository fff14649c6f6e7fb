"""Composing parts into one candidate: names kept apart, the parts' inputs dropped, the glue calls parts."""

from __future__ import annotations

import ast

from kb_mcp.decomposition.compose import PartSource, composed_source, renamed

PART = '''"""A part."""
from __future__ import annotations
import torch
import torch.nn as nn

scale = 2.0  # a module-level constant


def helper(x):
    return x * scale


class ModelNew(nn.Module):
    def forward(self, x):
        return helper(x)  # keep this comment


def get_inputs():
    return [torch.randn(2)]
'''


def test_a_part_is_renamed_apart_and_keeps_its_comments() -> None:
    text = renamed(PartSource(name="part02", source=PART, class_name="ModelNew", note="n"), "Part02")
    assert "class Part02(nn.Module)" in text and "part02_helper(x)" in text and "x * part02_scale" in text
    assert "# keep this comment" in text and "get_inputs" not in text and "__future__" not in text


def test_the_composed_file_names_no_reference_and_calls_each_part() -> None:
    ref = PART.replace("ModelNew", "Model")
    parts = [PartSource(name="part01", source=ref, class_name="Model", note="the reference part"),
             PartSource(name="part02", source=PART, class_name="ModelNew", note="candidate c1")]
    glue = "def forward(self, x):\n    submod_0 = self.submod_0(x)\n    submod_1 = self.submod_1(submod_0)\n" \
           "    return submod_1\n"
    text = composed_source("toy", parts, glue)
    tree = ast.parse(text)
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert "Model" not in names and "get_inputs" not in names  # what the static checks refuse
    assert "self.parts[0](x)" in text and "self.parts[1](submod_0)" in text
    assert {c.name for c in tree.body if isinstance(c, ast.ClassDef)} == {"Part01", "Part02", "ModelNew"}
