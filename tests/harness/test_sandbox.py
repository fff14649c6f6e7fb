"""The sandbox itself (`harness.sandbox`): real bubblewrap sandboxes on this machine, real processes.

What a sandboxed process sees and may do: its identity, its mount view (private places absent,
the shared cache read-only, its scratch the only writable folder), its environment, its network,
its system calls and limits; that it outlives the thread that started it but not its server; and
that the harness refuses clearly where no sandbox can be built.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kb_mcp.harness.sandbox import sandbox as sb
from kb_mcp.harness.sandbox import view
from kb_mcp.harness.sandbox.sandbox import Grant, Sandbox, SandboxUnavailable, detect
from kb_mcp.harness.sandbox.scratch import new_scratch

PROBE = r'''
import json, os, resource, socket, sys
out = {"uid": os.getuid(), "pid": os.getpid(), "host": socket.gethostname(), "cwd": os.getcwd(),
       "env": dict(os.environ), "root": sorted(os.listdir("/"))}
def tryit(name, fn):
    try:
        out[name] = fn()
    except Exception as exc:
        out[name] = f"{type(exc).__name__}: {exc}"
for name, path in json.loads(sys.argv[1]).items():
    tryit("read " + name, lambda p=path: open(p).read()[:40])
    tryit("list " + name, lambda p=path: sorted(os.listdir(p))[:5])
    tryit("write " + name, lambda p=path: open(os.path.join(p, "x") if os.path.isdir(p) else p, "a").write("x"))
tryit("write scratch", lambda: open(os.path.join(os.environ["HOME"], "mine"), "w").write("ok"))
tryit("write tmp", lambda: open("/tmp/kbmcp-sandbox-probe", "w").write("ok"))
tryit("connect", lambda: socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=2).send(b"leak"))
LIMITS = ("RLIMIT_FSIZE", "RLIMIT_DATA", "RLIMIT_NPROC", "RLIMIT_CPU")
tryit("limits", lambda: {n: resource.getrlimit(getattr(resource, n)) for n in LIMITS})
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
rc = libc.ptrace(0, 0, 0, 0)
out["ptrace"] = [rc, ctypes.get_errno()]
print(json.dumps(out))
'''


class Listener:
    """A real TCP server on this machine's loopback, recording what reaches it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self.received.append(conn.recv(4096) or b"(connected)")


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return detect()


def _probe(sandbox: Sandbox, paths: dict[str, Path], port: int, grant: Grant | None = None) -> dict:
    grant = grant or Grant(role="tool", scratch=new_scratch("test"))
    code, out = sandbox.run([sys.executable, "-c", PROBE, json.dumps({k: str(v) for k, v in paths.items()}), str(port)],
                            grant, timeout_s=120)
    assert code == 0, out
    return json.loads(out.strip().splitlines()[-1])


def test_what_a_sandboxed_process_sees_and_may_do(sandbox: Sandbox, tmp_path: Path, monkeypatch) -> None:
    kb = tmp_path / "kbhome"
    kb.mkdir()
    (kb / "kb.json").write_text("{}")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("PRIVATE KEY")
    cache = tmp_path / "cache"
    (cache / "torch_extensions").mkdir(parents=True)
    monkeypatch.setenv("KB_MCP_TOKEN", "tok-secret-1")
    monkeypatch.setenv("GITHUB_TOKEN", "tok-secret-2")
    monkeypatch.setenv("KB_MCP_SANDBOX_ENV", "GITHUB_TOKEN,LANG")  # asked for, but a secret's name: refused
    listener = Listener()
    scratch = new_scratch("test")
    grant = Grant(role="worker", scratch=scratch, ro=(cache / "torch_extensions",))
    seen = _probe(sandbox.with_private([kb]),
                  {"kb": kb / "kb.json", "ssh": home / ".ssh" / "id_rsa", "cache": cache / "torch_extensions",
                   "etc": Path("/etc/shadow"), "cwd": Path.cwd() / "pyproject.toml"}, listener.port, grant)
    assert seen["uid"] == sb.NOBODY and seen["host"] == "sandbox" and seen["pid"] < 10  # own user and pid namespace
    assert seen["cwd"] == str(scratch) and seen["env"]["HOME"] == str(scratch)
    for private in ("kb", "ssh", "etc", "cwd"):
        assert "FileNotFoundError" in seen[f"read {private}"], (private, seen[f"read {private}"])
    assert seen["list cache"] == [] and "Read-only file system" in seen["write cache"]
    assert seen["write scratch"] == 2 and (scratch / "mine").read_text() == "ok"
    assert seen["write tmp"] == 2 and not Path("/tmp/kbmcp-sandbox-probe").exists()  # a /tmp of its own
    assert not any("secret" in v for v in seen["env"].values()), seen["env"]
    assert set(seen["env"]) >= {"PATH", "HOME", "TMPDIR"} and "KB_MCP_TOKEN" not in seen["env"]
    assert "Error" in str(seen["connect"]) and listener.received == []  # its own network namespace
    limits = seen["limits"]
    assert limits["RLIMIT_FSIZE"][0] == sb.limits_for("worker").file_bytes
    assert limits["RLIMIT_NPROC"][0] == sb.limits_for("worker").processes
    if sb.seccomp_program() is not None:
        assert seen["ptrace"] == [-1, 1]  # EPERM from the seccomp filter


def test_a_process_outlives_the_thread_that_started_it(sandbox: Sandbox) -> None:
    """The parent-death signal follows the forking thread: the launcher thread forks, not the caller."""
    started: list[subprocess.Popen] = []
    thread = threading.Thread(target=lambda: started.append(sandbox.popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], Grant(role="tool", scratch=new_scratch("test")))))
    thread.start()
    thread.join()
    time.sleep(1.0)
    try:
        assert started[0].poll() is None
    finally:
        sb.kill_group(started[0])
        started[0].wait(10)


def test_an_interrupted_wait_kills_what_it_waited_for(sandbox: Sandbox) -> None:
    """Ctrl-C while `Sandbox.run` waits (a build, a compiler) ends the process too, not only the wait;
    and work that may wait runs at the niceness its limits give."""
    marker = f"kbmcp-interrupted-{os.getpid()}"
    previous = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        signal.alarm(2)
        with pytest.raises(KeyboardInterrupt):
            sandbox.run([sys.executable, "-c", f"import time; time.sleep(60)  # {marker}"],
                        Grant(role="tool", scratch=new_scratch("test")), timeout_s=120)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    deadline = time.monotonic() + 10
    while _processes_mentioning(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_mentioning(marker) == []
    limits = dataclasses.replace(sb.limits_for("build"), nice=7)
    code, out = sandbox.run([sys.executable, "-c", "import os; print(os.nice(0))"],
                            Grant(role="build", scratch=new_scratch("test")), timeout_s=60, limits=limits)
    assert code == 0 and int(out.strip().splitlines()[-1]) == os.nice(0) + 7


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and int(entry) != os.getpid():
            found.append(int(entry))
    return found


@pytest.mark.nvcc
def test_a_killed_server_leaves_no_worker_behind(tmp_path: Path) -> None:
    """A real `kb-mcp serve`, its workers started by a tool call, then SIGKILL: nothing of it remains."""
    import asyncio

    from kb_mcp.clients.mcp_client import call_json, connect_http, serve_command

    cache = tmp_path / "server-cache"
    env = {**os.environ, "KB_MCP_CACHE": str(cache)}
    proc = subprocess.Popen(serve_command(tmp_path / "kb.json", ["--http", "127.0.0.1:0"]), env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = ""
        assert proc.stderr is not None
        for line in proc.stderr:
            if "serving http " in line:
                url = line.split("serving http ", 1)[1].split()[0]
                break
        assert url, "the server did not start"
        problem = (Path(__file__).parent / "fixtures" / "relu_problem.py").read_text()
        candidate = (Path(__file__).parent / "fixtures" / "relu_nvrtc.py").read_text()

        async def call() -> dict:
            async with connect_http(url) as client:
                return await call_json(client, "compile_and_verify", {"problem": problem, "candidate": candidate})

        result = asyncio.run(call())
        assert result["record"]["verdict"] in ("needs_gpu", "faster", "slower"), result
        workers = _processes_mentioning(str(cache))
        assert workers, "the tool call should have left warm workers"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 20
        while _processes_mentioning(str(cache)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_mentioning(str(cache)) == []
    finally:
        if proc.poll() is None:
            proc.kill()


def test_no_sandbox_is_a_clear_refusal(tmp_path: Path, monkeypatch) -> None:
    # A bubblewrap that cannot create namespaces, as where user namespaces are off.
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sb, "bwrap_path", lambda: str(fake))
    sb._detect.cache_clear()
    try:
        with pytest.raises(SandboxUnavailable) as refused:
            sb._detect("")
        text = str(refused.value)
        assert "No permissions to create new namespace" in text and "KB_MCP_SANDBOX=unconfined" in text
        with pytest.raises(SandboxUnavailable, match="not a sandbox setting"):
            sb._detect("bogus")
        assert not sb._detect("unconfined").confined
    finally:
        sb._detect.cache_clear()


@pytest.mark.nvcc
def test_unconfined_by_choice_says_so_in_every_verdict(tmp_path: Path, relu_problem) -> None:
    from harness_helpers import fixture_source

    from kb_mcp.harness.pool.pool import WorkerPool

    with WorkerPool(tmp_path, no_cuda=True, spare=False, sandbox=Sandbox("unconfined",
                                                                         reason="KB_MCP_SANDBOX=unconfined")) as pool:
        result = pool.verify(relu_problem, fixture_source("relu_nvrtc.py"))
    assert result.flagged and "UNCONFINED" in result.summary and "KB_MCP_SANDBOX=unconfined" in result.summary


def test_a_toolkits_linked_nsight_compute_install_is_in_the_view(tmp_path: Path, monkeypatch) -> None:
    """As on the GPU machine: `<toolkit>/bin/ncu` is a launcher script that runs the real ncu from
    `<toolkit>/nsight-compute-<version>`, a link to an install elsewhere. Without the link's target
    in the view the launcher fails inside the sandbox ("Nsight Compute is not installed")."""
    real = tmp_path / "opt" / "nsight-compute" / "2099.1"
    real.mkdir(parents=True)
    (real / "ncu-real").write_text("#!/bin/sh\necho real-ncu-ran\n")
    (real / "ncu-real").chmod(0o755)
    toolkit = tmp_path / "cuda-99.0"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "nsight-compute-2099.1").symlink_to(real)
    launcher = toolkit / "bin" / "ncu"
    launcher.write_text('#!/bin/sh\nd="$(dirname "$0")/../nsight-compute-2099.1"\n'
                        '[ -x "$d/ncu-real" ] || { echo "ERROR : nsight-compute directory is not found"; exit 1; }\n'
                        'exec "$d/ncu-real"\n')
    launcher.chmod(0o755)
    monkeypatch.setenv("PATH", f"{toolkit / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert real in view._tool_roots()
    sandbox = Sandbox(mode="bwrap", bwrap=detect().bwrap, reason="")  # a fresh view, made with this PATH
    code, out = sandbox.run([str(launcher)], Grant(role="driver", scratch=new_scratch("test")), timeout_s=60)
    assert (code, out.strip()) == (0, "real-ncu-ran"), out
