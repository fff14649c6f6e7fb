"""Tracing a problem's model into a graph, splitting it into parts, and checking a recomposition
(worker side: runs only inside the sandbox; a problem is untrusted code).

    python -m kb_mcp.harness.worker.decompose_trace REQUEST.json RESULT.json

REQUEST is `{"action": "trace" | "split" | "check", "problems": [...]}`; RESULT gets one entry per
problem, in order, each `{"ok": true, ...}` or `{"ok": false, "error": "..."}`. The server side
(`kb_mcp.decomposition`) groups the traced graph into parts and writes the part files; this module
only does what needs torch:

* trace: the model built at its real sizes without allocating them (the meta device; a fake-tensor
  mode with a shape environment where construction reads a value, as `.item()` does), traced by
  `torch.fx.symbolic_trace` (torch.nn modules stay leaves), else by non-strict `torch.export` (outputs
  flattened, parameters put back as attributes), else not at all (the whole model is one part). Each
  node's result shape, FLOPs (`FlopCounterMode`) and bytes come from one run on meta/fake tensors.
* split: the same trace, cut by the server's assignment of nodes to parts (`fx.passes.split_module`):
  each part's forward source, the torch.nn modules it calls (constructor text), the tensors it reads
  (parameters, buffers: small buffers with their values, read from a CPU build), its inputs' shapes,
  and the glue (the top-level forward calling the parts).
* check: the model built for real (seeded; `batch_size` reduced where the problem has one), a
  composed candidate's ModelNew loaded with the model's state dict, both run on the same inputs:
  whether the outputs are bit-identical.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from kb_mcp.harness.worker.decompose_graph import reduced_batch, summary, trace_problem, wants_shrink
from kb_mcp.harness.worker.decompose_split import split_problem
from kb_mcp.harness.worker.loading import load_module

# -- check -----------------------------------------------------------------------------------------


def check_problem(module: Any, composed: Any, batch: int | None, shrink: bool = False) -> dict[str, Any]:
    """Whether the composed ModelNew, with the model's state dict, reproduces the model's output exactly."""
    with reduced_batch(module, batch, shrink):
        torch.manual_seed(0)
        init = module.get_init_inputs()
        model = module.Model(*init).eval()
        torch.manual_seed(1)
        inputs = module.get_inputs()
    torch.manual_seed(2)
    cand = composed.ModelNew(*init).eval()
    result = cand.load_state_dict(model.state_dict(), strict=False)
    with torch.no_grad():
        want = tree_leaves(model(*inputs))
        got = tree_leaves(cand(*inputs))
    same = len(want) == len(got) and all(
        isinstance(w, torch.Tensor) and isinstance(g, torch.Tensor) and w.shape == g.shape and w.dtype == g.dtype
        and torch.equal(w, g) for w, g in zip(want, got))
    diff = max((float((w.double() - g.double()).abs().max()) for w, g in zip(want, got)
                if isinstance(w, torch.Tensor) and isinstance(g, torch.Tensor) and w.shape == g.shape
                and w.numel()), default=0.0)
    return {"exact": same, "max_abs_diff": diff, "outputs": len(want),
            "missing_keys": list(result.missing_keys), "unexpected_keys": list(result.unexpected_keys),
            "input_shapes": [summary(x) for x in inputs]}


# -- the command -------------------------------------------------------------------------------------


def run_one(action: str, entry: dict[str, Any], index: int, workdir: Path) -> dict[str, Any]:
    """One problem of a request. `shrink` is a bool, or "auto" (`decompose_graph.wants_shrink`); the
    answer says which sizes it used (`shrunk`), for the next request on the same problem."""
    module = load_module(entry["source"], f"kbmcp_problem_{index}", workdir)
    batch = entry.get("batch")
    shrink = entry.get("shrink", False)
    shrink = wants_shrink(module, batch) if shrink == "auto" else bool(shrink)
    if action == "trace":
        with reduced_batch(module, batch, shrink):
            return {**trace_problem(module), "shrunk": shrink}
    if action == "split":
        with reduced_batch(module, batch, shrink):
            return split_problem(module, {str(k): int(v) for k, v in entry["assignment"].items()})
    if action == "check":
        composed = load_module(entry["composed"], f"kbmcp_composed_{index}", workdir)
        return check_problem(module, composed, batch, shrink)
    raise ValueError(f"unknown action {action!r}")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m kb_mcp.harness.worker.decompose_trace REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    request = json.loads(Path(argv[0]).read_text())
    workdir = Path(argv[1]).resolve().parent / "modules"
    torch.set_num_threads(max(1, int(request.get("threads", 1))))
    results = []
    for i, entry in enumerate(request["problems"]):
        try:
            results.append({"ok": True, **run_one(request["action"], entry, i, workdir)})
        except Exception as exc:  # noqa: BLE001 - a problem's failure is reported, the next one runs
            results.append({"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:1500]}"})
        Path(argv[1]).write_text(json.dumps(results))  # written as it goes: a crash keeps what was done
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
