"""The decomposition of every level-3 problem: how many parts, of which kinds, and the three largest
shares of the model's GPU time, in one table.

    python bench/decompose_level3.py ../shared/kernelbench/level3 --out decompositions.json [--jobs 2]

Each problem goes through `kb-mcp decompose` as a user's model would (traced in the sandbox at its real
sizes on the meta device, grouped into parts, each written as a problem of its own); the decompositions
run `--jobs` at a time. The shares are estimated from FLOPs and bytes against an H200's peaks where no
GPU profiled the forward, and the table says which (`basis`). Prints the table in Markdown and writes
its rows to `--out` as JSON.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from kb_mcp.campaign.selection import SelectionError, select_problems
from kb_mcp.decomposition.models import Decomposition

TIMEOUT_S = 900


class Share(BaseModel):
    """One part among the largest: its label, kind and share (all its places summed)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    kind: str
    label: str
    share: float


class Row(BaseModel):
    """One problem's decomposition, summed up."""

    model_config = ConfigDict(extra="forbid")

    problem: str
    status: str  # "ok", or what went wrong (the command's last words)
    method: str = ""
    parts: int = 0  # places in the model that run a part
    files: int = 0  # distinct part files (a part run at several places is written once)
    kinds: dict[str, int] = {}
    top: list[Share] = []
    basis: str = ""


def decompose(problem: Path, workdir: Path) -> Row:
    """`kb-mcp decompose` of one problem, read back from its decomposition.json."""
    out = workdir / problem.stem
    cmd = [sys.executable, "-m", "kb_mcp.server.cli", "decompose", str(problem), "--out", str(out)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return Row(problem=problem.stem, status=f"no answer within {TIMEOUT_S} s")
    record = out / "decomposition.json"
    if proc.returncode != 0 or not record.is_file():
        words = (proc.stderr or proc.stdout).strip().splitlines()
        return Row(problem=problem.stem, status=words[-1][:200] if words else f"exit {proc.returncode}")
    return summarize(problem.stem, json.loads(record.read_text()))


def summarize(problem: str, record: dict) -> Row:
    """The row of a decomposition record: parts by kind and the three largest shares (a part file's
    places summed, as `Decomposition.by_file` ranks them)."""
    decomp = Decomposition.model_validate(record)
    kinds: dict[str, int] = {}
    for p in decomp.parts:
        kinds[p.kind] = kinds.get(p.kind, 0) + 1
    ranked = decomp.by_file()
    top = [Share(name=p.name, kind=p.kind, label=p.label, share=share) for p, share, _ in ranked[:3]]
    return Row(problem=problem, status="ok", method=decomp.method, parts=len(decomp.parts), files=len(ranked),
               kinds=kinds, top=top, basis=decomp.share_basis)


def markdown(rows: list[Row]) -> str:
    """The table as docs/benchmarks.md shows it."""
    lines = ["| problem | trace | parts (files) | kinds | three largest shares | basis |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if r.status != "ok":
            lines.append(f"| {r.problem} | - | - | - | {r.status} | - |")
            continue
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(r.kinds.items(), key=lambda kv: -kv[1]))
        top = "; ".join(f"{s.label} {s.share:.0%}" for s in r.top)
        lines.append(f"| {r.problem} | {r.method} | {r.parts} ({r.files}) | {kinds} | {top} | {r.basis} |")
    return "\n".join(lines)


def main() -> None:
    """Decomposes every problem of the folder and prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a folder of problem files (KernelBench's level3)")
    parser.add_argument("--out", type=Path, help="the rows as JSON")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    try:
        problems = [ref.path for ref in select_problems([args.folder])]  # in KernelBench id order
    except SelectionError as exc:
        sys.exit(f"decompose_level3: {exc}")
    with tempfile.TemporaryDirectory(prefix="decompose-l3-") as tmp, \
            cf.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = {pool.submit(decompose, p, Path(tmp)): p for p in problems}
        rows = []
        for i, future in enumerate(cf.as_completed(futures), 1):
            row = future.result()
            rows.append(row)
            print(f"[{i}/{len(problems)}] {row.problem}: {row.status}", file=sys.stderr, flush=True)
    order = {p.stem: i for i, p in enumerate(problems)}
    rows.sort(key=lambda r: order[r.problem])
    print(markdown(rows))
    ok = sum(r.status == "ok" for r in rows)
    print(f"\n{ok} of {len(rows)} problems decomposed")
    if args.out:
        args.out.write_text(json.dumps([r.model_dump(mode="json") for r in rows], indent=1))


if __name__ == "__main__":
    main()
