"""What a sandboxed process prints is kept within a bound (`harness.sandbox.waiting`): the rule on
text, then real sandboxed processes that print without end through `Sandbox.run` (a problem traced,
a compiler, cuobjdump). ncu's process reader: tests/profiling/test_prof_ncu_output.py."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from kb_mcp.harness.sandbox.sandbox import Grant, Sandbox, detect
from kb_mcp.harness.sandbox.scratch import new_scratch
from kb_mcp.harness.sandbox.waiting import OUTPUT_LIMIT_CHARS, BoundedText

MARKER = "characters of output left out"


def _kept(pieces: list[str], limit: int) -> BoundedText:
    kept = BoundedText(limit)
    for piece in pieces:
        kept.add(piece)
    return kept


@pytest.mark.parametrize("pieces", [["ab"] * 100, ["x" * 7, "y" * 300, "z" * 3], ["0123456789" * 50], ["q"] * 41])
def test_the_first_and_last_half_are_kept_and_what_lies_between_is_counted(pieces: list[str]) -> None:
    whole = "".join(pieces)
    kept = _kept(pieces, 40)
    head, rest = kept.text.split("\n[... ", 1)
    count, tail = rest.split(f" {MARKER} ...]\n", 1)
    assert head == whole[:20] and tail == whole[-20:]
    assert int(count) == len(whole) - 40


def test_output_within_the_bound_comes_back_whole() -> None:
    assert _kept(["line 1\n", "line 2\n"], 40).text == "line 1\nline 2\n"
    assert _kept(["a" * 20, "b" * 20], 40).text == "a" * 20 + "b" * 20  # exactly the bound: nothing left out


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return detect()


FLOOD = "import sys\nsys.stdout.write('start\\n')\npiece = {piece}\nfor _ in range({n}): sys.stdout.write(piece)\n" \
        "sys.stdout.write('the end\\n')\nsys.stdout.flush()\n"
PIECES = {"no newline": ("'y' * (1 << 20)", 1 << 20), "lines": ("'line of output\\n' * 4096", 15 * 4096)}


@pytest.mark.parametrize("kind", sorted(PIECES))
def test_a_process_printing_hundreds_of_mb_returns_its_ends_within_the_bound(sandbox: Sandbox, kind: str) -> None:
    piece, size = PIECES[kind]
    code, out = sandbox.run([sys.executable, "-c", FLOOD.format(n=300, piece=piece)],
                            Grant(role="tool", scratch=new_scratch("test")), timeout_s=120)
    assert code == 0
    assert len(out) < OUTPUT_LIMIT_CHARS + 100
    assert out.startswith("start\n") and out.endswith("the end\n")
    left_out = int(out.split("\n[... ", 1)[1].split(" ")[0])
    assert left_out == len("start\n") + 300 * size + len("the end\n") - OUTPUT_LIMIT_CHARS


def test_a_process_printing_without_end_is_killed_at_its_limit_with_its_output_bounded(sandbox: Sandbox) -> None:
    t0 = time.monotonic()
    code, out = sandbox.run([sys.executable, "-c", "import sys\nwhile True: sys.stdout.write('z' * 65536)"],
                            Grant(role="tool", scratch=new_scratch("test")), timeout_s=3)
    assert code == -9 and out.endswith("[killed after 3 s]")
    assert len(out) < OUTPUT_LIMIT_CHARS + 100 and MARKER in out
    assert time.monotonic() - t0 < 30


def test_input_is_still_given_and_a_process_that_never_reads_it_still_ends(sandbox: Sandbox) -> None:
    code, out = sandbox.run([sys.executable, "-c", "import sys; print(sys.stdin.read().upper())"],
                            Grant(role="tool", scratch=new_scratch("test")), timeout_s=60, input_text="hello")
    assert (code, out.strip()) == (0, "HELLO")
    code, out = sandbox.run([sys.executable, "-c", "print('done')"], Grant(role="tool", scratch=new_scratch("test")),
                            timeout_s=60, input_text="x" * (8 << 20))  # far more than a pipe holds, never read
    assert (code, out.strip()) == (0, "done")


def test_the_time_limit_starts_again_each_time_the_caller_says_the_process_moved_on(sandbox: Sandbox) -> None:
    """`wait_for`'s `restart` (a decomposition's next problem answered): each piece has the whole limit."""
    from kb_mcp.harness.sandbox.waiting import wait_for

    sleeper = [sys.executable, "-c", "import time; time.sleep(3.5); print('finished')"]
    asked = []

    def moved_on() -> bool:
        asked.append(time.monotonic())
        return len(asked) <= 3  # the first three seconds each count as progress

    proc = sandbox.popen(sleeper, Grant(role="tool", scratch=new_scratch("test")), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    ended = wait_for(proc, 1.5, restart=moved_on)
    assert (ended.code, ended.output.strip(), ended.timed_out) == (0, "finished", False)
    proc = sandbox.popen(sleeper, Grant(role="tool", scratch=new_scratch("test")), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    ended = wait_for(proc, 1.5, restart=lambda: False)
    assert ended.timed_out and ended.code == -9 and ended.output.endswith("[killed after 2 s]")
