"""`python -m fakellm --script FILE`: serve a script until killed; prints the base URL first."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from fakellm.server import FakeLLMServer, Script


def main() -> int:
    parser = argparse.ArgumentParser(prog="fakellm")
    parser.add_argument("--script", required=True, type=Path, help="JSON file of a Script")
    parser.add_argument("--log", type=Path, help="append every request here as JSON lines")
    args = parser.parse_args()
    script = Script.model_validate_json(args.script.read_text())
    with FakeLLMServer(script, log_path=args.log) as server:
        print(server.base_url, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    sys.exit(main())
