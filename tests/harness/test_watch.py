"""The watch records what a sandboxed process tried, from outside it: real sandboxes, real system calls."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from kb_mcp.harness.sandbox.attempts import MAX_KEPT, AttemptLog, collecting
from kb_mcp.harness.sandbox.sandbox import Grant, Sandbox, detect


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    sb = detect()
    if sb.watch_unavailable():
        pytest.skip(f"attempts cannot be recorded here: {sb.watch_unavailable()}")
    return sb


def run(sandbox: Sandbox, tmp_path: Path, code: str, role: str = "worker") -> tuple[str, AttemptLog]:
    with collecting() as seen:
        rc, out = sandbox.run([sys.executable, "-c", code], Grant(role=role, scratch=tmp_path),  # type: ignore[arg-type]
                              timeout_s=120)
    assert rc == 0, out
    return out, seen


def lines(seen: AttemptLog) -> str:
    return "\n".join(a.line() for a in seen.attempts)


HOSTILE = r"""
import ctypes, os, socket, subprocess
try: socket.create_connection(("1.1.1.1", 443), timeout=1)
except OSError: pass
try: open("/usr/planted", "w")
except OSError: pass
try: open("/home/someone/.ssh/id_rsa")
except OSError: pass
subprocess.run(["/bin/sh", "-c", "curl -s http://x/ || true"])
libc = ctypes.CDLL(None, use_errno=True)
assert libc.ptrace(0, 0, 0, 0) == -1 and ctypes.get_errno() == 1
print("done")
"""


def test_each_kind_of_attempt_is_recorded_with_what_was_tried(sandbox: Sandbox, tmp_path: Path) -> None:
    out, seen = run(sandbox, tmp_path, HOSTILE)
    text = lines(seen)
    for tried in ("network: connect 1.1.1.1:443", "write: open for writing /usr/planted",
                  "read: open /home/someone/.ssh/id_rsa", "program: execve /usr/bin/curl", "syscall: ptrace (refused)"):
        assert tried in text, text
    assert not seen.unrecorded and "done" in out


def test_an_honest_process_leaves_no_record(sandbox: Sandbox, tmp_path: Path) -> None:
    code = ("import os, subprocess, tempfile, torch\n"
            "open(os.path.join(os.environ['HOME'], 'mine.txt'), 'w').write('x')\n"
            "print(open(os.path.join(os.environ['HOME'], 'mine.txt')).read())\n"
            "tempfile.NamedTemporaryFile().write(b'y')\n"
            "import ctypes.util; ctypes.util.find_library('m')\n"
            "import platform; platform.architecture()\n"  # runs `file -b` on the interpreter
            "subprocess.run(['uname', '-m'], check=True)\n"
            "print((torch.ones(4) * 2).sum().item())\n")
    out, seen = run(sandbox, tmp_path, code)
    assert seen.attempts == [] and "8.0" in out, lines(seen)


PATH_SEARCH = r"""
import errno, os, stat, subprocess
home = os.environ["HOME"]
os.environ["PATH"] = os.path.join(home, "bin") + ":" + os.environ["PATH"]  # a folder that is not there
subprocess.run(["uname", "-m"], check=True)  # found further along PATH
try:
    os.execv(os.path.join(home, "gone", "gcc"), ["gcc"])
except OSError as exc:
    assert exc.errno == errno.ENOENT, exc
mine = os.path.join(home, "mine.sh")
open(mine, "w").write("#!/bin/sh\necho ran\n")
os.chmod(mine, stat.S_IRWXU)
subprocess.run([mine], check=True)  # a program it wrote itself: an attempt
print("done")
"""


def test_a_search_along_path_is_no_attempt_and_what_it_wrote_still_is(sandbox: Sandbox, tmp_path: Path) -> None:
    """nvcc looks for gcc, subprocess for a program, along PATH: what is not there is answered ENOENT by
    the watch itself, unrecorded (on the GPU machines PATH's first folder lies under /tmp)."""
    out, seen = run(sandbox, tmp_path, PATH_SEARCH)
    text = lines(seen)
    assert "done" in out and "ran" in out, out
    assert "mine.sh" in text and "/bin/uname" not in text and "gone" not in text, text
    assert len(seen.attempts) == 1, text


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no host compiler here")
def test_the_compilers_the_toolchain_starts_are_no_attempt(sandbox: Sandbox, tmp_path: Path) -> None:
    (tmp_path / "k.cpp").write_text("#include <vector>\nint f() { return std::vector<int>(3).size(); }\n")
    with collecting() as seen:
        rc, out = sandbox.run(["g++", "-O1", "-c", "k.cpp", "-o", "k.o"], Grant(role="compiler", scratch=tmp_path),
                              timeout_s=300)
        if shutil.which("nvcc"):
            (tmp_path / "k.cu").write_text("__global__ void k(float* x) { x[0] = 1.f; }\n")
            rc2, out2 = sandbox.run(["nvcc", "-c", "k.cu", "-o", "kc.o"], Grant(role="compiler", scratch=tmp_path),
                                    timeout_s=300)
            assert rc2 == 0, out2
    assert rc == 0, out
    assert seen.attempts == [], lines(seen)


SILENCE = r"""
import ctypes, os, signal, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
# its own filter: a seccomp() call and prctl(PR_SET_SECCOMP) (refused, so no filter can shadow the watch)
libc.prctl(38, 1, 0, 0, 0)  # no_new_privs, which a filter needs
assert libc.syscall(317, 1, 0, 0) == -1
assert libc.prctl(22, 2, 0, 0, 0) == -1
# hide its memory from the reader, close and replace every descriptor it might think is the record
assert libc.prctl(4, 0, 0, 0, 0) == -1
os.closerange(3, 4096)
devnull = os.open("/dev/null", os.O_RDWR)
for fd in (1, 2):
    os.dup2(devnull, fd)
# forge a record, and try to kill whatever watches it
print('{"code": "sandbox_attempt", "attempts": []}')
for pid in (1, os.getppid()):
    try: os.kill(pid, signal.SIGKILL)
    except OSError: pass
try: socket.create_connection(("10.9.8.7", 22), timeout=1)
except OSError: pass
"""


def test_silencing_or_forging_the_record_is_itself_recorded(sandbox: Sandbox, tmp_path: Path) -> None:
    with collecting() as seen:
        sandbox.run([sys.executable, "-c", SILENCE], Grant(role="worker", scratch=tmp_path), timeout_s=120)
    text = lines(seen)
    assert "tamper: seccomp(): a seccomp filter of its own" in text, text
    assert "tamper: prctl(PR_SET_SECCOMP)" in text and "tamper: prctl(PR_SET_DUMPABLE)" in text, text
    assert "network: connect 10.9.8.7:22" in text, text  # what it did after all that is still on record


def test_a_flood_is_capped_and_said(sandbox: Sandbox, tmp_path: Path) -> None:
    code = ("import socket\nfor i in range(300):\n    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "    try: s.sendto(b'x', ('10.0.%d.%d' % (i // 250, i % 250), 9))\n    except OSError: pass\n"
            "    s.close()\n")
    _out, seen = run(sandbox, tmp_path, code)
    attempts = seen.attempts
    assert len(attempts) == MAX_KEPT + 1 and attempts[-1].kind == "flood", attempts[-3:]
    assert attempts[-1].what.startswith(f"{300 - MAX_KEPT} more")


def test_unconfined_processes_are_said_to_be_unrecorded(tmp_path: Path) -> None:
    unconfined = Sandbox("unconfined", reason="test")
    with collecting() as seen:
        rc, _ = unconfined.run([sys.executable, "-c", "print(1)"], Grant(role="tool", scratch=tmp_path), timeout_s=60)
    assert rc == 0 and seen.unrecorded == {"the sandbox is unconfined"}


TOOL_SCRIPT = r"""#!/bin/sh
# a toolchain's wrapper finding its own version, as the CUDA toolkit's ncu does
here=$(dirname "$(readlink -f -- "$0")")
basename "$here" >/dev/null
echo 2025.3.1 | cut -d. -f1
"""

RUNS_SCRIPTS = r"""
import os, stat, subprocess, sys
subprocess.run(["/bin/sh", sys.argv[1]], check=True)  # the toolchain's script: its programs are its work
mine = os.path.join(os.environ["HOME"], "wrapper.sh")  # the same script, written by the process itself
open(mine, "w").write(open(sys.argv[1]).read())
subprocess.run(["/bin/sh", mine], check=True)
subprocess.run(["cut", "-d,", "-f2"], input=b"1,2\n", check=True)  # started by the process itself
# a shell's command text, or its standard input, that names the toolchain's script first: no script
subprocess.run(["/bin/sh", "-c", sys.argv[1] + " >/dev/null; echo 3:4 | cut -d: -f1"], check=True)
subprocess.run(["/bin/sh", "-s", sys.argv[1]], input=b"echo 5/6 | cut -d/ -f2\n", check=True)
print("done")
"""


def test_programs_a_toolchain_script_starts_are_no_attempt(sandbox: Sandbox, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """ncu is a shell script of the toolkit that starts readlink, dirname, cut... to find its version:
    those are the toolchain's work; the same programs started by a script the process wrote, or by the
    process itself, are attempts."""
    toolkit = tmp_path / "toolkit"
    (toolkit / "bin").mkdir(parents=True)
    script = toolkit / "bin" / "tool"
    script.write_text(TOOL_SCRIPT)
    script.chmod(0o755)
    monkeypatch.setenv("KB_MCP_SANDBOX_RO", str(toolkit))  # a toolchain folder, as the CUDA toolkit's
    # (the sandbox's common view was taken before: the grant mounts the folder, the watch reads the setting)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with collecting() as seen:
        rc, out = sandbox.run([sys.executable, "-c", RUNS_SCRIPTS, str(script)],
                              Grant(role="driver", scratch=scratch, ro=[toolkit]), timeout_s=120)
    assert rc == 0 and "done" in out, out
    text = lines(seen)
    for program in ("readlink", "dirname", "basename"):
        assert text.count(f"/{program}") == 1, text  # once: from the script the process wrote
    # from the written script, from the process itself, from the command text and the standard input
    assert text.count("/cut") == 4, text
