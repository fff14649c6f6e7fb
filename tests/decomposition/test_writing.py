"""Writing a part file: its forward's inputs named by position, so two places of a model that compute
the same on the same tensors write the same text."""

from __future__ import annotations

from kb_mcp.decomposition.writing import canonical_inputs, computation, without_doc

STEP = '''def forward(self, cat_1, hidden):
    i2h_weight = self.i2h.weight
    linear = torch.ops.aten.linear.default(cat_1, i2h_weight);  cat_1 = i2h_weight = None
    note = "cat_1 stays in a string"
    return torch.tanh(linear) + hidden
'''


def test_inputs_are_renamed_by_position_everywhere_but_in_strings() -> None:
    text = canonical_inputs(STEP)
    assert text.startswith("def forward(self, input_0, input_1):")
    assert "torch.ops.aten.linear.default(input_0, i2h_weight);  input_0 = i2h_weight = None" in text
    assert '"cat_1 stays in a string"' in text and "+ input_1" in text
    compile(text, "<part>", "exec")
    # the next step's forward reads the same, but for its string
    assert canonical_inputs(STEP.replace("cat_1", "cat_2")) == text.replace('"cat_1 ', '"cat_2 ')


def test_a_taken_name_or_a_varargs_forward_is_left_as_it_is() -> None:
    taken = STEP.replace("note =", "input_1 =")
    assert canonical_inputs(taken) == taken
    varargs = "def forward(self, *args):\n    return args[0]\n"
    assert canonical_inputs(varargs) == varargs
    assert canonical_inputs("def forward(self, x:\n") == "def forward(self, x:\n"  # not code: unchanged


def test_without_doc_keeps_what_the_file_computes() -> None:
    assert without_doc('"""Part 3 of 9."""\nimport torch\n') == "\nimport torch\n"
    assert without_doc("import torch\n") == "import torch\n"


def test_two_places_that_compute_the_same_are_the_same_computation() -> None:
    one = ('"""Part 2 of 9."""\nclass Model:\n    def forward(self, input_0):\n'
           '        mul = input_0 * w\n        return mul\n')
    two = one.replace("Part 2", "Part 4").replace("mul", "mul_1")
    assert computation(one) == computation(two)
    assert computation(one) != computation(two.replace("* w", "* v"))  # another tensor: another computation
    assert computation(one) != computation(one.replace("* w", "+ w"))


def test_attributes_and_keywords_spelled_as_an_input_stay_what_they_are() -> None:
    code = ("def forward(self, view, input):\n"
            "    out = torch.ops.aten.view.default(view, [4]);  view = None\n"
            "    return torch.add(out, other=input, alpha=1)\n")
    text = canonical_inputs(code)
    assert "torch.ops.aten.view.default(input_0, [4]);  input_0 = None" in text
    assert "torch.add(out, other=input_1, alpha=1)" in text
    other = code.replace("view", "reshape")  # another op, the same shape of code
    assert computation(code) != computation(other)
