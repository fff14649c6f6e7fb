"""bench/decompose_level3.py: each problem through the real `kb-mcp decompose`, summed up per row (parts
by kind, a part's places summed into its first file's share, the three largest), a failure a row that
says so, and the table as docs/benchmarks.md shows it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from decompose_level3 import Row, markdown, summarize  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "problems"


def _part(name: str, kind: str, share: float, same_as: str | None = None) -> dict:
    return {"index": int(name[1:]), "name": name, "kind": kind, "label": name.upper(), "nodes": [name],
            "share": share, "same_as": same_as}


def test_a_parts_places_add_up_under_its_first_file_and_the_three_largest_lead() -> None:
    record = {"problem": "m", "method": "fx", "built_on": "meta", "share_basis": "estimated", "parts": [
        _part("p1", "gemm", 0.1), _part("p2", "norm", 0.3), _part("p3", "gemm", 0.2, same_as="p1"),
        _part("p4", "gemm", 0.25, same_as="p1"), _part("p5", "pool", 0.15)]}
    row = summarize("m", record)
    assert (row.parts, row.files, row.kinds) == (5, 3, {"gemm": 3, "norm": 1, "pool": 1})
    assert [(s.name, round(s.share, 2)) for s in row.top] == [("p1", 0.55), ("p2", 0.3), ("p5", 0.15)]
    md = markdown([row, Row(problem="broken", status="fx: TypeError")])
    assert "| m | fx | 5 (3) | gemm 3, norm 1, pool 1 | P1 55%; P2 30%; P5 15% | estimated |" in md
    assert "| broken | - | - | - | fx: TypeError | - |" in md


def test_the_bench_decomposes_each_problem_of_a_folder(tmp_path: Path) -> None:
    folder = tmp_path / "level3"
    folder.mkdir()
    (folder / "1_softmax.py").write_text((EXAMPLES / "softmax.py").read_text())
    (folder / "2_broken.py").write_text("raise SystemExit('not a problem')\n")
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(BENCH / "decompose_level3.py"), str(folder), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = {r["problem"]: r for r in json.loads(out.read_text())}
    assert rows["1_softmax"]["status"] == "ok" and rows["1_softmax"]["parts"] >= 1
    assert abs(sum(s["share"] for s in rows["1_softmax"]["top"]) - 1.0) < 1e-6  # one or two parts: all of it
    assert rows["2_broken"]["status"] != "ok"
    assert "1 of 2 problems decomposed" in proc.stdout
