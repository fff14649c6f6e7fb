"""A real HTTP server speaking the OpenAI chat-completions protocol, answering from a script.

Campaign tests point the real `openai` client at it over loopback. The script is an ordered
list of rules; a request takes the first rule whose role, problem and text filters match and
that still has answers left, and gets that rule's next answer. Answers can be text (code,
prose, JSON, refusals, garbage), an HTTP error status (to exercise retries) or a delay.

The role and problem are read from the prompts the campaign sends: the system prompt starts
with ``[kb-mcp role: NAME]`` and the user prompt names the problem on a ``Problem: NAME`` line.

Run standalone (used by tests that start campaigns in a subprocess):
    python -m fakellm --script script.json --port 0     # prints the base URL on stdout
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

ROLE_RE = re.compile(r"\[kb-mcp role: (\w+)\]")
PROBLEM_RE = re.compile(r"^Problem: (\S+)", re.MULTILINE)


class Answer(BaseModel):
    """One scripted reply."""

    model_config = ConfigDict(extra="forbid")

    text: str = ""
    status: int = 200  # anything else is sent as an OpenAI-style error body
    delay_s: float = 0.0  # sleep before answering (timeouts)
    finish_reason: str = "stop"
    usage: bool = True  # False: omit the usage block, as some local servers do
    body: str | None = None  # sent as it is (status 200) instead of a chat completion: a garbage answer


Responder = Callable[[list[dict[str, Any]]], str]
"""Computes an answer from the request's messages (in-process servers only)."""


class Rule(BaseModel):
    """Answers for requests that match every given filter (None matches anything).

    A rule gives its `answers` in order, or, with a `responder`, computes each answer from the
    request (for answers that must quote ids the server only learns from the prompt).
    """

    model_config = ConfigDict(extra="forbid")

    role: str | None = None
    problem: str | None = None
    contains: str | None = None  # substring of the last user message
    answers: list[Answer] = Field(default_factory=list)
    responder: Responder | None = Field(default=None, exclude=True)
    repeat_last: bool = True  # once used up, keep giving the last answer
    cycle: bool = False  # once used up, start again from the first answer
    used: int = 0

    def matches(self, role: str | None, problem: str | None, last_user: str) -> bool:
        """True when this rule applies to the request and has an answer left."""
        if self.role is not None and self.role != role:
            return False
        if self.problem is not None and self.problem != problem:
            return False
        if self.contains is not None and self.contains not in last_user:
            return False
        return self.responder is not None or self.repeat_last or self.cycle or self.used < len(self.answers)

    def next_answer(self, messages: list[dict[str, Any]]) -> Answer:
        """The next answer: computed by the responder, else the next in order (the last again when used up)."""
        self.used += 1
        if self.responder is not None:
            try:
                return Answer(text=self.responder(messages))
            except Exception as exc:  # noqa: BLE001 - a broken test script shows up as a server error, not a hang
                return Answer(status=500, text=f"responder failed: {type(exc).__name__}: {exc}")
        if self.cycle:
            return self.answers[(self.used - 1) % len(self.answers)]
        return self.answers[min(self.used - 1, len(self.answers) - 1)]


class Script(BaseModel):
    """The whole script: rules tried in order, and what to say when none matches."""

    model_config = ConfigDict(extra="forbid")

    rules: list[Rule] = Field(default_factory=list)
    fallback: Answer = Answer(text="I cannot help with that request.")


class RecordedRequest(BaseModel):
    """What one request asked, for assertions."""

    model_config = ConfigDict(extra="forbid")

    model: str
    role: str | None
    problem: str | None
    messages: list[dict[str, Any]]
    answered_status: int
    answer: str

    @property
    def last_user(self) -> str:
        """Text of the last user message."""
        users = [m.get("content", "") for m in self.messages if m.get("role") == "user"]
        return users[-1] if users else ""


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the openai client expects
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        # The openai client honours this, so retry tests do not wait out its default backoff.
        self.send_header("retry-after-ms", "10")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._send(200, {"object": "list", "data": [{"id": "fake-model", "object": "model", "owned_by": "tests"}]})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            self._send(400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}})
            return
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
            return
        messages = [{"role": m.get("role"), "content": _text_of(m.get("content"))} for m in body.get("messages", [])]
        if not messages or "model" not in body:
            self._send(400, {"error": {"message": "model and messages are required", "type": "invalid_request_error"}})
            return
        answer, role, problem = self.server.choose(messages)
        if answer.delay_s:
            time.sleep(answer.delay_s)
        self.server.record(
            RecordedRequest(
                model=body["model"],
                role=role,
                problem=problem,
                messages=messages,
                answered_status=answer.status,
                answer=answer.text,
            )
        )
        if answer.body is not None:
            data = answer.body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if answer.status != 200:
            self._send(answer.status, {"error": {"message": answer.text or "scripted failure", "type": "server_error"}})
            return
        prompt_chars = sum(len(m["content"]) for m in messages)
        reply: dict[str, Any] = {
            "id": f"chatcmpl-fake-{self.server.count}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": answer.text},
                    "finish_reason": answer.finish_reason,
                }
            ],
        }
        if answer.usage:
            prompt_tokens, completion_tokens = max(1, prompt_chars // 4), max(1, len(answer.text) // 4)
            reply["usage"] = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            }
        self._send(200, reply)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, script: Script, log_path: Path | None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = script
        self.log_path = log_path
        self.requests: list[RecordedRequest] = []
        self.lock = threading.Lock()

    @property
    def count(self) -> int:
        return len(self.requests)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client killed mid-request (the resume tests SIGKILL campaigns) is expected, not an error.
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)

    def choose(self, messages: list[dict[str, Any]]) -> tuple[Answer, str | None, str | None]:
        system = "\n".join(m["content"] for m in messages if m["role"] == "system")
        users = [m["content"] for m in messages if m["role"] == "user"]
        first_user = users[0] if users else ""
        role_match = ROLE_RE.search(system)
        problem_match = PROBLEM_RE.search(first_user)
        role = role_match.group(1) if role_match else None
        problem = problem_match.group(1) if problem_match else None
        last_user = users[-1] if users else ""
        with self.lock:
            for rule in self.script.rules:
                if rule.matches(role, problem, last_user):
                    return rule.next_answer(messages), role, problem
        return self.script.fallback, role, problem

    def record(self, request: RecordedRequest) -> None:
        with self.lock:
            self.requests.append(request)
            if self.log_path is not None:
                with self.log_path.open("a") as fh:
                    fh.write(request.model_dump_json() + "\n")


class FakeLLMServer:
    """Context manager running the scripted server on a loopback port in a background thread."""

    def __init__(self, script: Script, log_path: Path | None = None) -> None:
        self._server = _Server(script, log_path)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fakellm", daemon=True
        )

    @property
    def base_url(self) -> str:
        """The `/v1` URL to give an OpenAI client."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request answered so far, in order."""
        with self._server.lock:
            return list(self._server.requests)

    def requests_for(self, role: str, problem: str | None = None) -> list[RecordedRequest]:
        """The requests of one role (and problem)."""
        return [r for r in self.requests if r.role == role and (problem is None or r.problem == problem)]

    def start(self) -> FakeLLMServer:
        """Starts serving; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops serving and closes the socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
