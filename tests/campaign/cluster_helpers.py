"""What the cluster's tests share: a verification running on some worker, and solution folders
named as the example problems they solve."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from kb_mcp.campaign.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
# example problem -> its example candidate (the eval matches a solution by the problem's file name)
EXAMPLE_PAIRS = {
    "swish": "swish_nvrtc", "elementwise_chain_small": "elementwise_chain_small_nvrtc", "softmax": "softmax_nvrtc",
    "linear_sum": "linear_sum_rewrite_nvrtc", "row_sum": "row_sum_load_inline",
    "elementwise_chain_deep": "elementwise_chain_deep_load_inline",
}


def example_solutions(folder: Path) -> Path:
    """A solutions folder holding each example candidate under its problem's name."""
    folder.mkdir(parents=True, exist_ok=True)
    for problem, candidate in EXAMPLE_PAIRS.items():
        shutil.copy(EXAMPLES / "candidates" / f"{candidate}.py", folder / f"{problem}.py")
    return folder


def slow_to_load(problem: Path, dest: Path, seconds: float) -> Path:
    """`problem`'s source written to `dest`, made to take `seconds` to load: every verification of it
    lasts that long at least, so a test's kill lands while work is left."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(problem.read_text() + f"\n\nimport time as _t\n\n_t.sleep({seconds})\n")
    return dest


def running_on(cluster: Cluster, timeout: float = 60.0) -> tuple[str, str]:
    """(worker address, task key) of a verification a worker is running, once one is."""
    def processing(dask_scheduler=None) -> dict[str, list[str]]:
        return {ws.address: [str(ts.key) for ts in ws.processing] for ws in dask_scheduler.workers.values()}

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for address, keys in cluster.client.run_on_scheduler(processing).items():
            if keys:
                return address, keys[0]
        time.sleep(0.1)
    raise AssertionError("no verification started on the cluster")
