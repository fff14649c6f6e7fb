"""What the tests of builds ahead share: a load_inline candidate a CPU-only torch can build, and a look
at the processes below the test's own (to show that none is left running)."""

from __future__ import annotations

import os
import time
from pathlib import Path

# A load_inline candidate a CPU-only torch can build: a CPython module in C++ (no torch headers, so
# it builds in seconds), with host flags of its own. Its forward calls into the extension.
ANSWER = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <Python.h>
#define KBMCP_CAT2(a, b) a##b
#define KBMCP_CAT(a, b) KBMCP_CAT2(a, b)
static PyObject* answer(PyObject*, PyObject*) { return PyLong_FromLong(KBMCP_ANSWER); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, "the answer"}, {nullptr, nullptr, 0, nullptr}};
static PyModuleDef module = {PyModuleDef_HEAD_INIT, "answer", nullptr, -1, methods};
PyMODINIT_FUNC KBMCP_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&module); }
BROKEN
"""

_ext = load_inline(name="kbmcp_answer", cpp_sources=SOURCE, no_implicit_headers=True,
                   extra_cflags=["-O2", "-DKBMCP_ANSWER=VALUE"])


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.clamp(x, min=0) * (_ext.answer() / VALUE)
'''


def answer_candidate(value: int, broken: bool = False) -> str:
    """The host-only candidate, its extension returning `value` (`broken`: a C++ syntax error in it)."""
    return ANSWER.replace("VALUE", str(value)).replace("BROKEN", "int broken(" if broken else "")


def descendants(pid: int) -> list[str]:
    """Command lines of the processes below `pid` (from /proc)."""
    parents: dict[int, int] = {}
    cmdlines: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
            cmdlines[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent]
        found += children
        frontier += children
    return [cmdlines.get(p, "") for p in found]


def gone(words: tuple[str, ...], within_s: float = 10.0) -> bool:
    """Whether, within `within_s`, no process below this one has any of `words` in its command line
    (a killed sandbox's processes end a moment after its outer process)."""
    deadline = time.monotonic() + within_s
    while any(w in c for c in descendants(os.getpid()) for w in words):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


