"""harness/worker/loading.py: what a verification imports is dropped, and what outlives it is not
walked again by every later garbage collection of the worker."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

# Run in a fresh interpreter: freezing the heap is a whole-process act, not one for the test runner.
SCRIPT = textwrap.dedent('''
    import gc, json, sys, weakref
    from pathlib import Path
    from kb_mcp.harness.worker.loading import load_module, unload_modules

    gc.collect(); gc.freeze()  # as the worker does once it is set up
    module = load_module(sys.argv[2], "cand_1", Path(sys.argv[1]))
    cycle = weakref.ref(module.CYCLE)  # garbage once the module is gone (a cycle: only gc frees it)
    before = len(gc.get_objects())
    del module
    unload_modules(["cand_1"])
    print(json.dumps({"walked_before": before, "walked_after": len(gc.get_objects()),
                      "frozen": gc.get_freeze_count(), "cycle_freed": cycle() is None,
                      "still_imported": "cand_1" in sys.modules}))
''')

# A candidate-like module that imports a large library (email's parsers: thousands of objects that
# outlive the module) and leaves a reference cycle behind.
CANDIDATE = textwrap.dedent('''
    import email.parser, json.decoder, xml.dom.minidom

    class Node:
        pass

    CYCLE = Node()
    CYCLE.self = CYCLE
''')


def test_unloading_drops_the_module_collects_its_garbage_and_freezes_what_lives_on(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), CANDIDATE], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert not seen["still_imported"] and seen["cycle_freed"], seen
    # the libraries it imported stay loaded, but out of the collector's walk
    assert seen["walked_before"] > 2000 and seen["walked_after"] < 200, seen
