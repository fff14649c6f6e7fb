"""Own kernels for the Linear parts of KernelBench level-3 models, from the strict-FP32 tensor-core GEMM.

    python bench/l3_linear_parts.py [PROBLEM ...] [--kernelbench DIR] [--out DIR]
    python bench/l3_linear_parts.py --verify [--kb PATH] [PROBLEM ...]     # on an H100/H200 (sm_90a)

Each model (a level-3 problem stem; default: the MLPs, the vanilla RNNs, LeNet-5 and SwinMLP) is
decomposed into OUT/<problem>/ (docs/models.md). Every part that is one nn.Linear with an optional
pointwise epilogue gets a candidate from bench/tc_fp32_parts.py (`part_candidate`): the 3xTF32 wgmma
core with the bias and the activation fused, its Linear at the part's own dotted name. The table says,
per GEMM part, what it is, its estimated share of the model and the candidate written or why none.

With --verify (a GPU: the core is sm_90a) the script does what an agent does, through a `kb-mcp serve`
on stdio over the KB --kb (default OUT/kb.json): decompose_problem writes the parts, compile_and_verify
checks each candidate against its part in track fp32, record_outcome credits each standard verdict
(state tensor_cores_idle, optimization compensated_fp32_tensor_cores, as for the fp32_tc solutions),
and decompose_problem with compose=true composes the model from the parts' best verdicts and verifies
it in composed mode. Per model it prints eager, torch.compile, ours, the coverage and the parts replaced.
A verdict is keyed by its part file's content hash; the places of a model that run the same computation
on the same tensors (an unrolled RNN's steps) share one part file, verified once. --most bounds the
verifications per model to the largest part files.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tc_fp32_parts import PartRefused, part_candidate

from kb_mcp.decomposition.decompose import load

DEFAULT_PROBLEMS = ("1_MLP", "2_ShallowWideMLP", "3_DeepNarrowMLP", "33_VanillaRNN", "34_VanillaRNNHidden",
                    "4_LeNet5", "29_SwinMLP")
STATE, OPTIMIZATION = "tensor_cores_idle", "compensated_fp32_tensor_cores"  # as fp32_tc/manifest.json has them
Call = Callable[[str, dict[str, Any], float], Awaitable[dict[str, Any]]]


@dataclass
class PartRow:
    """One GEMM part, and what became of it."""

    problem: str
    part: str
    label: str
    share: float  # of the model's time
    part_file: Path
    candidate: Path | None = None
    why_not: str = ""
    verdict: str = ""
    speedup: float | None = None


@dataclass
class ModelRow:
    """The composed model's verdict."""

    problem: str
    eager_ms: float | None = None
    compile_ms: float | None = None
    ours_ms: float | None = None
    coverage: float | None = None
    replaced: str = ""
    verdict: str = ""


def kernelbench_dir(given: str | None) -> Path:
    """The KernelBench checkout: --kernelbench, else $KB_MCP_KERNELBENCH, else /work/shared/kernelbench."""
    return Path(given or os.environ.get("KB_MCP_KERNELBENCH") or "/work/shared/kernelbench")


def decompose(model: Path, folder: Path) -> None:
    """`kb-mcp decompose MODEL --out FOLDER` (in the sandbox, at the model's real sizes)."""
    kb_mcp = shutil.which("kb-mcp", path=str(Path(sys.executable).parent)) or shutil.which("kb-mcp")
    if kb_mcp is None:
        raise SystemExit("kb-mcp is not installed beside this Python")
    proc = subprocess.run([kb_mcp, "decompose", str(model), "--out", str(folder)], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"kb-mcp decompose {model.stem} failed: {proc.stderr.strip()[-2000:]}")


def part_rows(folder: Path) -> tuple[list[PartRow], dict[str, int]]:
    """The GEMM parts of the decomposition in `folder`, largest share first, each with its candidate
    written to folder/candidates/<part>.py or the generator's reason for none; the other parts counted
    by kind."""
    decomp = load(folder)
    rows: list[PartRow] = []
    others: dict[str, int] = {}
    for part, share, _ in decomp.by_file():  # a file several places run (an RNN's steps) once, its shares summed
        if part.kind != "gemm":
            others[part.kind] = others.get(part.kind, 0) + 1
            continue
        row = PartRow(decomp.problem, part.name, part.label, share, folder / part.file)
        rows.append(row)
        try:
            source = part_candidate(row.part_file, decomp.problem)
        except PartRefused as exc:
            row.why_not = str(exc)
            continue
        row.candidate = folder / "candidates" / f"{part.name}.py"
        row.candidate.parent.mkdir(exist_ok=True)
        row.candidate.write_text(source)
    return rows, others


def parts_table(problem: str, rows: list[PartRow], others: dict[str, int], shown: int = 12) -> str:
    """The `shown` largest GEMM parts, a line for the rest of them (an RNN has one per step), a line
    for the parts that are not GEMMs, and what the candidates cover."""
    lines = []
    for r in rows[:shown]:
        what = f"candidates/{r.part}.py" if r.candidate else f"none: {r.why_not}"
        verdict = f"  {r.verdict}" + (f" {r.speedup:.2f}x" if r.speedup else "") if r.verdict else ""
        lines.append(f"  {problem:<20} {r.part:<8} {r.label:<16} {100 * r.share:5.1f} %  {what}{verdict}")
    rest = rows[shown:]
    if rest:
        served = [r for r in rest if r.candidate]
        lines.append(f"  {problem:<20} {len(rest)} more GEMM parts ({100 * sum(r.share for r in rest):.1f} %): "
                     f"{len(served)} with a candidate ({100 * sum(r.share for r in served):.1f} %)")
    if others:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(others.items()))
        lines.append(f"  {problem:<20} not Linear parts: {kinds}")
    served = [r for r in rows if r.candidate]
    lines.append(f"  {problem:<20} candidates for {len(served)} of {len(rows)} GEMM parts, "
                 f"{100 * sum(r.share for r in served):.1f} % of the model's estimated time")
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return f"{value:.3f} ms" if value is not None else "-"


def model_line(m: ModelRow) -> str:
    """A composed model's figures in one line."""
    coverage = f"{100 * m.coverage:.0f} %" if m.coverage is not None else "-"
    return (f"  {m.problem:<20} {m.verdict:<10} eager {_ms(m.eager_ms)}  torch.compile {_ms(m.compile_ms)}  "
            f"ours {_ms(m.ours_ms)}  coverage {coverage}  parts replaced {m.replaced}")


async def verify_parts(call: Call, rows: list[PartRow], most: int) -> None:
    """compile_and_verify the candidates of the `most` largest parts against their parts (track fp32);
    record_outcome for each standard verdict."""
    for row in [r for r in rows if r.candidate][:most]:
        assert row.candidate is not None
        result = await call("compile_and_verify", {"problem": str(row.part_file), "candidate": str(row.candidate),
                                                   "options": {"track": "fp32"}}, 1800)
        record = result["record"]
        row.verdict, row.speedup = str(record.get("verdict")), record.get("speedup_vs_baseline")
        print(f"  {row.problem} {row.part}: {row.verdict}" + (f", {row.speedup:.2f}x" if row.speedup else ""),
              flush=True)
        if record.get("strength") == "standard":
            analysis = (f"{row.problem} {row.part} ({row.label}, {100 * row.share:.1f} % of the model): 3xTF32 "
                        f"wgmma GEMM with the bias and activation fused. Verdict {row.verdict}.")
            await call("record_outcome", {"state_id": STATE, "optimization_id": OPTIMIZATION,
                                          "candidate_id": record["candidate_id"], "analysis": analysis}, 60)


async def compose(call: Call, model: Path, folder: Path) -> ModelRow:
    """decompose_problem with compose=true: the model from its parts' best verdicts, verified composed."""
    result = await call("decompose_problem", {"problem": str(model), "out_dir": str(folder), "compose": True}, 3600)
    picks = result.get("picks", [])
    row = ModelRow(model.stem, replaced=f"{sum(p.get('taken') == 'candidate' for p in picks)} of {len(picks)}")
    record = (result.get("verification") or {}).get("record") or {}
    row.verdict = str(record.get("verdict", "unverified"))
    row.eager_ms, row.compile_ms = record.get("eager_ms"), record.get("compile_ms")
    row.ours_ms, row.coverage = record.get("time_ms"), record.get("coverage")
    return row


async def run_verify(models: list[Path], out: Path, kb: Path, most: int) -> list[ModelRow]:
    """The agent's path over one stdio server: decompose, write the candidates, verify, record, compose."""
    from mcp import Client
    from mcp_types import Implementation

    from kb_mcp.clients.mcp_client import call_json, stdio_params

    results = []
    async with Client(stdio_params(kb), client_info=Implementation(name="l3_linear_parts", version="1")) as client:

        async def call(tool: str, arguments: dict[str, Any], timeout_s: float) -> dict[str, Any]:
            return await call_json(client, tool, arguments, timeout_s=timeout_s)

        for model in models:
            folder = out / model.stem
            await call("decompose_problem", {"problem": str(model), "out_dir": str(folder)}, 600)
            rows, others = part_rows(folder)
            await verify_parts(call, rows, most)
            print(parts_table(model.stem, rows, others), flush=True)
            results.append(await compose(call, model, folder))
            print(model_line(results[-1]), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", nargs="*", default=list(DEFAULT_PROBLEMS), help="level-3 problem stems")
    parser.add_argument("--kernelbench", help="KernelBench checkout (default $KB_MCP_KERNELBENCH, else "
                        "/work/shared/kernelbench)")
    parser.add_argument("--out", type=Path, default=Path("l3-linear-parts"), help="where the decompositions go")
    parser.add_argument("--verify", action="store_true", help="verify and compose on this machine's GPU (sm_90a)")
    parser.add_argument("--kb", type=Path, help="the KB for --verify (default OUT/kb.json)")
    parser.add_argument("--most", type=int, default=16, help="--verify: the candidates of at most this many "
                        "parts per model, largest share first (default 16: an RNN has one part per step)")
    args = parser.parse_args(argv)
    level3 = kernelbench_dir(args.kernelbench) / "level3"
    models = [level3 / f"{p}.py" for p in args.problems]
    missing = [str(m) for m in models if not m.is_file()]
    if missing:
        print(f"not found: {', '.join(missing)}", file=sys.stderr)
        return 2
    out = args.out.resolve()
    if args.verify:
        rows = asyncio.run(run_verify(models, out, (args.kb or out / "kb.json").resolve(), args.most))
        print("\n".join(model_line(r) for r in rows))
        return 0 if all(r.verdict in ("faster", "slower") for r in rows) else 1
    for model in models:
        decompose(model, out / model.stem)
        print(parts_table(model.stem, *part_rows(out / model.stem)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
