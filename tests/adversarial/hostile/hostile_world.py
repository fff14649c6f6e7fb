"""A server's world for hostile candidates to attack, and the check that they changed nothing
(the fixtures are in conftest.py).

`ServerWorld` is what a kb-mcp server holds and a hostile candidate wants: a real KB (seeded, with
a journal line and its lock), artifacts beside it (another agent's candidate, a job record, a
profile), a home folder with an SSH key, API tokens in the environment, a published build in the
shared cache, a listener on this machine's loopback, and a marker path nothing may create. Each
hostile file (tests/adversarial/hostile/*.py) is a candidate whose `__TARGETS__` (and `__KB__`,
`__SSH_KEY__`, ... inside string literals) the world fills in with its real paths: the attacker
knows exactly where everything is. `assert_untouched` then requires every file of the KB, the
artifacts, the home folder and the cache byte-identical, the marker absent, the listener silent,
and no secret in any text that came back.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

from kb_mcp.kb.models import CandidateRecord, Verdict
from kb_mcp.kb.store import KBStore

HERE = Path(__file__).resolve().parent
WORKING_KERNEL = HERE.parents[2] / "examples" / "candidates" / "swish_nvrtc.py"
SECRETS = {
    "KB_MCP_TOKEN": "kbtok-7f3e9a1c-never-leaves",
    "KB_MCP_LLM_API_KEY": "sk-llm-5b2d8e0f-never-leaves",
    "OPENAI_API_KEY": "sk-openai-91c4a7d2-never-leaves",
    "GITHUB_TOKEN": "ghp-3e8b1f6a-never-leaves",
}
SSH_KEY = ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA-never-leaves\n-----END OPENSSH PRIVATE "
           "KEY-----\n")
KB_SECRET = "kb-content-4d9e2b7c-never-leaves"


class Listener:
    """A real TCP and UDP server on this machine's loopback, recording anything that reaches it."""

    def __init__(self) -> None:
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen()
        self.port = self.tcp.getsockname()[1]
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", self.port))
        self.received: list[bytes] = []
        threading.Thread(target=self._tcp, daemon=True).start()
        threading.Thread(target=self._udp, daemon=True).start()

    def _tcp(self) -> None:
        while True:
            try:
                conn, _ = self.tcp.accept()
            except OSError:
                return
            with conn:
                self.received.append(b"tcp:" + (conn.recv(65536) or b"(connected)"))

    def _udp(self) -> None:
        while True:
            try:
                self.received.append(b"udp:" + self.udp.recv(65536))
            except OSError:
                return

    def close(self) -> None:
        self.tcp.close()
        self.udp.close()


def _digest(root: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            out[str(path)] = "link:" + os.readlink(path)
        elif path.is_file():
            out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif path.is_dir():
            out[str(path)] = "dir"
    return out


@dataclass
class ServerWorld:
    """The places and secrets of one kb-mcp server (see the module docstring)."""

    root: Path
    listener: Listener = field(default_factory=Listener)

    def __post_init__(self) -> None:
        self.kb_dir = self.root / "kbhome"
        self.kb = self.kb_dir / "kb.json"
        self.home = self.root / "home"
        self.cache = self.root / "cache"
        self.marker = self.root / "PLANTED-BY-CANDIDATE"
        store = KBStore.open(self.kb)
        with store.transaction() as tx:  # a journal line and the lock beside the KB
            tx.put_candidate(CandidateRecord(candidate_id="c_0123456789abcdef", problem=KB_SECRET,
                                             problem_hash="f" * 16, verdict=Verdict.slower))
        self.journal = self.kb.with_name(self.kb.name + ".journal")
        self.lock = self.kb.with_name(self.kb.name + ".lock")
        assert self.journal.is_file(), "the KB keeps a journal beside it"
        self.artifacts = self.kb_dir / "kb.artifacts"
        self.other_candidate = self.artifacts / "candidates" / "c_0123456789abcdef.py"
        for path, text in ((self.other_candidate, "class ModelNew: pass  # another agent's\n"),
                           (self.artifacts / "jobs" / "j_0123456789.json", '{"state": "done"}'),
                           (self.artifacts / "profiles" / "p_0123456789ab.json", '{"kernels": []}'),
                           (self.home / ".ssh" / "id_rsa", SSH_KEY),
                           (self.home / ".config" / "kb-mcp" / "token", SECRETS["KB_MCP_TOKEN"])):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        name = "bystander_0123456789abcdef"
        self.published = self.cache / "torch_extensions" / name / f"{name}.so"
        self.published.parent.mkdir(parents=True)
        self.published.write_bytes(b"\x7fELF another candidate's published build")
        (self.cache / "baselines").mkdir()

    @property
    def targets(self) -> dict[str, object]:
        """What the attacker is told: every path it wants, and the listener's port."""
        return {"kb": str(self.kb), "kb_dir": str(self.kb_dir), "journal": str(self.journal), "lock": str(self.lock),
                "artifacts": str(self.artifacts), "other_candidate": str(self.other_candidate),
                "home": str(self.home), "ssh_key": str(self.home / ".ssh" / "id_rsa"), "cache": str(self.cache),
                "published": str(self.published), "cwd": os.getcwd(), "marker": str(self.marker),
                "port": self.listener.port}

    def with_working_kernel(self, name: str) -> str:
        """The hostile candidate `name` carrying a working kernel beside its attack: its own model is
        renamed, its refused builds (the compiler tricks) are caught, and a real fused swish kernel
        (examples/candidates/swish_nvrtc.py) is the ModelNew. The attack runs at import as before."""
        text = self.render(name).replace("class ModelNew(", "class _HostileModel(")
        lines = text.splitlines()
        first = next((i for i, line in enumerate(lines) if line.startswith(("_ext = load_inline(", "_a = "))), None)
        if first is not None:  # the builds the allow-lists refuse raise: the candidate goes on without them
            last = next(i for i in range(first, len(lines)) if lines[i].startswith("class "))
            body = [("    " + line) if line.strip() else line for line in lines[first:last]]
            lines[first:last] = ["try:", *body, "except Exception:", "    pass", ""]
        return "\n".join(lines) + "\n\n" + WORKING_KERNEL.read_text()

    def render(self, name: str) -> str:
        """The hostile candidate `name` with the real paths filled in."""
        text = (HERE / name).read_text()
        t = self.targets
        text = text.replace("__TARGETS__", repr(t))
        for key in ("ssh_key", "marker", "kb", "journal"):
            text = text.replace(f"__{key.upper()}__", str(t[key]))
        return text

    def snapshot(self) -> dict[str, str]:
        """Every file of the KB, its artifacts, the home folder and the shared cache, by content."""
        out: dict[str, str] = {}
        for root in (self.kb_dir, self.home, self.cache / "torch_extensions", self.cache / "baselines"):
            out.update(_digest(root))
        return out

    def assert_untouched(self, before: dict[str, str], *texts: str) -> None:
        """Nothing of the server's changed, nothing reached the listener, no secret came back."""
        after = self.snapshot()
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        # The server itself may publish a build of the candidate's own (a new folder): not a change
        # of anything that was there.
        changed = [k for k in changed if k in before or "/torch_extensions/" not in k]
        assert changed == [], f"changed: {changed}"
        assert not self.marker.exists(), "a candidate's command reached the server's side"
        assert not (self.kb_dir / "planted").exists()
        assert self.listener.received == [], self.listener.received
        joined = "\n".join(texts)
        for secret in [*SECRETS.values(), SSH_KEY.splitlines()[1], KB_SECRET]:
            assert secret not in joined, f"a secret came back: {secret}"


CASES = sorted(p.name for p in HERE.glob("*.py") if not p.name.startswith(("test_", "conftest", "hostile_world")))
RUNS_AT_IMPORT = [c for c in CASES if c not in ("compiler_flag_tricks.py", "include_tricks.py")]
# What the server's record of attempts names for each class that runs (`harness.sandbox.watch`).
TRIED = {
    "cpp_static_constructor.py": ["program: execve /usr/bin/touch", "program: execve /usr/bin/cat"],
    "delete_kb.py": ["write: unlink", "kb.json", "open for writing"],
    "forge_job_record.py": ["write: mkdir", "j_forged.json"],
    "forge_journal.py": ["write: open for writing", "kb.json.lock", "kb.json.journal"],
    "network_exfiltration.py": ["network: connect 127.0.0.1:", "network: sendto 127.0.0.1:", "connect 1.1.1.1:443"],
    "read_secrets.py": ["read: open", ".ssh/id_rsa"],
    "subprocess_spellings.py": ["program: execve /usr/bin/touch", "program: execve /usr/bin/rm"],
    "write_outside_scratch.py": ["write: open for writing", "planted.so", "planted.json"],
}


def protection(name: str) -> str:
    """The 'Stopped by:' paragraph of a hostile file's docstring."""
    doc = (HERE / name).read_text().split('"""')[1]
    return doc.split("Stopped by:", 1)[1].strip().split("\n\n")[0]
