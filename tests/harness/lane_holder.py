"""A process that takes the GPU lane, for the tests that need more than one process.

    python lane_holder.py WHAT [--times N] [--hold-s S] [--until-stdin-closes] [--child]

It holds the lane (`harness.gpu.lane.hold`) N times for S seconds each (or, with
--until-stdin-closes, once until its stdin closes); with --child it starts a process while it holds
the lane (`sleep`, told to keep every descriptor it may), which outlives it if it is killed.
stdout gets one JSON line per event (`waiting` with the progress message, `entered` with the hold,
`left`); stderr gets the lane's INFO log, which the tests read back with `harness.gpu.lane.read_spans`.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time


def _say(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def main() -> None:
    """Holds the lane as the arguments say."""
    parser = argparse.ArgumentParser()
    parser.add_argument("what")
    parser.add_argument("--times", type=int, default=1)
    parser.add_argument("--hold-s", type=float, default=0.0)
    parser.add_argument("--until-stdin-closes", action="store_true")
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    from kb_mcp.harness.gpu import lane

    def progress(done: float, total: float | None = None, message: str | None = None) -> None:
        _say("waiting", message=message)

    for _ in range(args.times):
        with lane.hold(args.what, progress) as held:
            child = subprocess.Popen(["sleep", "120"], close_fds=False) if args.child else None
            _say("entered", hold=held.model_dump(), child=child.pid if child else None)
            if args.until_stdin_closes:
                sys.stdin.read()
            else:
                time.sleep(args.hold_s)
        _say("left")


if __name__ == "__main__":
    main()
