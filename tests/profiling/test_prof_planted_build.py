"""The planted-bottleneck programs build, and the compiler confirms the bottlenecks that show at
compile time (spills, register pressure, shared-memory size)."""

from __future__ import annotations

import concurrent.futures
import re
import subprocess
from pathlib import Path

import pytest

PLANTED = Path(__file__).resolve().parents[1] / "fixtures" / "planted"
CHECKED = ("spills", "reg_occupancy", "stream", "bank_conflicts", "wmma_global")


def _build(source: Path, out: Path) -> tuple[str, int, str]:
    flags = re.search(r"//\s*nvcc-flags:\s*(.*)", source.read_text())
    cmd = ["nvcc", "-O3", "-arch=sm_90", "-Xptxas", "-v", *(flags.group(1).split() if flags else []),
           "-o", str(out / source.stem), str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return source.stem, proc.returncode, proc.stdout + proc.stderr


@pytest.mark.nvcc
def test_planted_programs_build_with_their_bottlenecks(tmp_path: Path) -> None:
    # The programs whose bottleneck the compiler can confirm; the GPU recorder builds all of them.
    sources = [PLANTED / f"{name}.cu" for name in CHECKED]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        results = {name: (rc, log) for name, rc, log in pool.map(lambda s: _build(s, tmp_path), sources)}
    failed = {name: log[-800:] for name, (rc, log) in results.items() if rc != 0}
    assert not failed, failed

    def props(name: str) -> tuple[int, int]:
        log = results[name][1]
        regs = int(re.search(r"Used (\d+) registers", log).group(1))
        spills = int(re.search(r"(\d+) bytes spill stores", log).group(1))
        return regs, spills

    assert props("spills")[1] > 0, "the spill program must spill under -maxrregcount=32"
    regs, spills = props("reg_occupancy")
    assert regs > 96 and spills == 0, "register pressure without spills: occupancy is the bottleneck"
    assert props("stream")[1] == 0
    assert "4096 bytes smem" in results["bank_conflicts"][1]
