"""The LLM client of autonomous campaigns: chat completions on any OpenAI-compatible endpoint.

OpenAI, vLLM, Ollama and llama.cpp all speak the same `/v1/chat/completions` protocol, so one
client (the `openai` package) reaches all of them by base URL, key and model. Each agent role
may use its own model (a small model for simple roles). Every call's tokens are counted per role
and per problem in a `TokenLedger`, which campaigns persist with their raw results.

Configuration, highest precedence first: explicit values (CLI flags), then the environment:

    KB_MCP_LLM_BASE_URL      endpoint, e.g. http://localhost:8000/v1 (default: OpenAI's)
    KB_MCP_LLM_API_KEY       key (local servers usually accept any string)
    KB_MCP_LLM_MODEL         model for every role
    KB_MCP_LLM_MODEL_<ROLE>  model for one role, e.g. KB_MCP_LLM_MODEL_REVIEW=small-model
    KB_MCP_LLM_TIMEOUT       seconds per request (default 300)
    KB_MCP_LLM_MAX_RETRIES   retries on connection errors, timeouts, 429 and 5xx (default 3)
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

ENV_BASE_URL = "KB_MCP_LLM_BASE_URL"
ENV_API_KEY = "KB_MCP_LLM_API_KEY"
ENV_MODEL = "KB_MCP_LLM_MODEL"
ENV_MODEL_PREFIX = "KB_MCP_LLM_MODEL_"
ENV_TIMEOUT = "KB_MCP_LLM_TIMEOUT"
ENV_MAX_RETRIES = "KB_MCP_LLM_MAX_RETRIES"

# Local servers (vLLM, Ollama, llama.cpp) ignore the key, but the openai package insists on one.
_PLACEHOLDER_KEY = "not-needed"


class Role(str, Enum):
    """The agent roles of a campaign; each may be served by its own model."""

    generate = "generate"  # first CUDA implementation of a PyTorch reference
    # apply one selected optimization to the current kernel; the member shadows str.lower, which no
    # caller uses on a Role, and its value is the name configurations use
    lower = "lower"  # type: ignore[assignment]
    review = "review"  # soft verification: dropped functionality the tests might miss
    evaluate = "evaluate"  # PolicyEvaluation: predictions vs the replay buffer
    analyze = "analyze"  # PerfGapAnalysis: why predictions and measurements differ
    update = "update"  # ParameterUpdate: typed KB edits


class LLMNotConfigured(RuntimeError):
    """No endpoint or model was given; the message says how to configure one."""


class LLMSettingInvalid(LLMNotConfigured):
    """A setting of the LLM (a KB_MCP_LLM_ variable or its flag) holds a value that cannot be used;
    the message names it and what it takes."""


class LLMError(RuntimeError):
    """The endpoint failed after all retries, or answered with something that is not a chat reply."""


NOT_CONFIGURED_HELP = (
    "no LLM is configured. Point kb-mcp at any OpenAI-compatible endpoint, either with flags\n"
    "  kb-mcp run-campaign --llm-base-url http://localhost:8000/v1 --llm-model MODEL [--llm-api-key KEY] ...\n"
    "or with the environment\n"
    f"  export {ENV_BASE_URL}=http://localhost:8000/v1   # omit for api.openai.com\n"
    f"  export {ENV_API_KEY}=...                         # local servers accept any string\n"
    f"  export {ENV_MODEL}=MODEL                         # {ENV_MODEL_PREFIX}<ROLE> overrides one role\n"
    "(An MCP agent such as Claude Code needs none of this: it is the LLM, and `kb-mcp serve` its bench.)"
)


class LLMConfig(BaseModel):
    """Where the LLM lives and how to talk to it. The key is never written to campaign files."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = None
    api_key: str | None = Field(default=None, exclude=True, repr=False)
    model: str | None = None
    role_models: dict[Role, str] = Field(default_factory=dict)
    timeout_s: float = Field(default=300.0, gt=0, allow_inf_nan=False)
    max_retries: int = Field(default=3, ge=0)
    temperature: float | None = None
    max_tokens: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> LLMConfig:
        """Reads the environment, then applies `overrides` that are not None (CLI flags win)."""
        env = os.environ if env is None else env
        role_models: dict[Role, str] = {
            role: env[ENV_MODEL_PREFIX + role.value.upper()]
            for role in Role
            if env.get(ENV_MODEL_PREFIX + role.value.upper())
        }
        values: dict[str, object] = {
            "base_url": env.get(ENV_BASE_URL) or None,
            "api_key": env.get(ENV_API_KEY) or None,
            "model": env.get(ENV_MODEL) or None,
            "role_models": role_models,
        }
        named: dict[str, str] = {}  # field -> the variable its value came from, to name it in an error
        for field, name in (("timeout_s", ENV_TIMEOUT), ("max_retries", ENV_MAX_RETRIES)):
            if env.get(name, "").strip():
                values[field], named[field] = env[name].strip(), name
        for key, value in overrides.items():
            if value is None:
                continue
            if key == "role_models":
                if not isinstance(value, Mapping):
                    raise TypeError(f"role_models must map roles to models, not {type(value).__name__}")
                merged = dict(role_models)
                merged.update({Role(k): v for k, v in value.items()})
                values[key] = merged
            else:
                values[key] = value
                named.pop(key, None)
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = str(err["loc"][0]) if err["loc"] else ""
            setting = f"${named[field]}" if field in named else f"the LLM's {field}"
            raise LLMSettingInvalid(f"{setting}={err.get('input')!r} cannot be used: {err['msg'].lower()}; give a "
                                    "valid value, or leave it unset for the default") from exc

    @property
    def configured(self) -> bool:
        """True when a model is known for every role and an endpoint (or a key for OpenAI) is given."""
        every_role = self.model is not None or all(role in self.role_models for role in Role)
        return every_role and (self.base_url is not None or self.api_key is not None)

    def model_for(self, role: Role) -> str:
        """The model serving `role` (its override, else the default model)."""
        model = self.role_models.get(role) or self.model
        if not model:
            raise LLMNotConfigured(NOT_CONFIGURED_HELP)
        return model

    def require(self) -> LLMConfig:
        """Returns self, or raises LLMNotConfigured with instructions when something is missing."""
        if not self.configured:
            raise LLMNotConfigured(NOT_CONFIGURED_HELP)
        return self


class TokenCount(BaseModel):
    """Tokens spent by some set of calls."""

    model_config = ConfigDict(extra="forbid")

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens

    def add(self, other: TokenCount) -> None:
        """Adds `other` in place."""
        self.calls += other.calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens


class TokenLedger(BaseModel):
    """Token use per role and per problem; safe to share between rollout threads."""

    model_config = ConfigDict(extra="forbid")

    by_role: dict[str, TokenCount] = Field(default_factory=dict)
    by_problem: dict[str, TokenCount] = Field(default_factory=dict)

    def record(self, role: Role | str, problem: str | None, count: TokenCount) -> None:
        """Adds one call's tokens under its role and (when known) its problem."""
        role_key = role.value if isinstance(role, Role) else role
        with _LEDGER_LOCK:
            self.by_role.setdefault(role_key, TokenCount()).add(count)
            if problem:
                self.by_problem.setdefault(problem, TokenCount()).add(count)

    def merge(self, other: TokenLedger) -> None:
        """Adds every count of `other` into this ledger."""
        with _LEDGER_LOCK:
            for key, count in other.by_role.items():
                self.by_role.setdefault(key, TokenCount()).add(count)
            for key, count in other.by_problem.items():
                self.by_problem.setdefault(key, TokenCount()).add(count)

    @property
    def total(self) -> TokenCount:
        """Every call of every role."""
        out = TokenCount()
        for count in self.by_role.values():
            out.add(count)
        return out


# One lock for all ledgers: pydantic models cannot carry a lock field cleanly, and contention is nil.
_LEDGER_LOCK = threading.RLock()


class ChatMessage(BaseModel):
    """One message of a conversation."""

    model_config = ConfigDict(extra="forbid")

    role: str  # system | user | assistant
    content: str


class ChatReply(BaseModel):
    """The text of one completion and what it cost."""

    model_config = ConfigDict(extra="forbid")

    text: str
    model: str
    finish_reason: str | None = None
    tokens: TokenCount
    tokens_estimated: bool = False  # the endpoint reported no usage; counted from characters


class _ReplyMessage(BaseModel):
    content: str | None = None


class _ReplyChoice(BaseModel):
    message: _ReplyMessage


class _ReplyShape(BaseModel):
    """The part of a chat completion this client reads; local servers differ in the rest (some omit
    `created` or `usage`), so only this is required of them."""

    choices: list[_ReplyChoice]


def _is_completion(body: str) -> bool:
    """Whether a response body has a chat completion's shape: the openai package hands on a body that
    is not JSON, or JSON of another shape, half-parsed (a str, a list, a choice without a message)."""
    try:
        _ReplyShape.model_validate_json(body)
    except ValidationError:
        return False
    return True


def _estimate_tokens(text: str) -> int:
    # About four characters per token for English and code; only used when the server reports no usage.
    return max(1, len(text) // 4) if text else 0


class LLMClient:
    """Chat completions with retries, timeouts and token accounting.

    Retries with exponential backoff (and honouring Retry-After) are the `openai` package's own,
    applied to connection errors, timeouts, 408/409/429 and 5xx answers.
    """

    def __init__(self, config: LLMConfig, ledger: TokenLedger | None = None) -> None:
        self.config = config.require()
        self.ledger = ledger if ledger is not None else TokenLedger()
        import openai  # a second to import: only when a client is made, not when the CLI starts

        self._openai_error = openai.OpenAIError
        self._client = openai.OpenAI(
            base_url=config.base_url,
            api_key=config.api_key or _PLACEHOLDER_KEY,
            timeout=config.timeout_s,
            max_retries=config.max_retries,
        )

    def chat(
        self,
        role: Role,
        messages: Sequence[ChatMessage],
        *,
        problem: str | None = None,
        ledger: TokenLedger | None = None,
    ) -> ChatReply:
        """Sends `messages` to the model of `role`; counts tokens in this client's ledger and `ledger`.

        Raises LLMError when the endpoint still fails after the retries, naming the endpoint and model.
        """
        model = self.config.model_for(role)
        extra: dict[str, Any] = {}
        if self.config.temperature is not None:
            extra["temperature"] = self.config.temperature
        if self.config.max_tokens is not None:
            extra["max_tokens"] = self.config.max_tokens
        where = f"{self.config.base_url or 'api.openai.com'} (model {model})"
        for attempt in range(self.config.max_retries + 1):
            try:
                raw = self._client.chat.completions.with_raw_response.create(
                    model=model,
                    messages=cast("list[ChatCompletionMessageParam]", [m.model_dump() for m in messages]),
                    **extra,
                )
            except self._openai_error as exc:
                raise LLMError(f"LLM call for role {role.value!r} to {where} failed: {exc}") from exc
            if _is_completion(raw.text):
                response = raw.parse()
                break
            # A body that is no chat completion (a proxy's error page, a cut-off answer): the
            # endpoint's fault, retried like a 5xx; the openai package itself would not retry it.
            if attempt == self.config.max_retries:
                raise LLMError(f"LLM call for role {role.value!r} to {where} failed: the endpoint answered "
                               f"{self.config.max_retries + 1} times with something that is not a chat completion "
                               f"(it began {raw.text[:80]!r}); check that the base URL is an OpenAI-compatible "
                               "/v1 endpoint and that the server is healthy")
        if not response.choices:
            raise LLMError(f"LLM endpoint returned no choices for role {role.value!r} (model {model})")
        choice = response.choices[0]
        text = choice.message.content or ""
        usage = response.usage
        if usage is not None:
            count = TokenCount(
                calls=1, prompt_tokens=usage.prompt_tokens or 0, completion_tokens=usage.completion_tokens or 0
            )
        else:
            prompt_chars = "".join(m.content for m in messages)
            count = TokenCount(
                calls=1, prompt_tokens=_estimate_tokens(prompt_chars), completion_tokens=_estimate_tokens(text)
            )
        self.ledger.record(role, problem, count)
        if ledger is not None and ledger is not self.ledger:
            ledger.record(role, problem, count)
        return ChatReply(
            text=text,
            model=response.model or model,
            finish_reason=choice.finish_reason,
            tokens=count,
            tokens_estimated=usage is None,
        )

    def close(self) -> None:
        """Closes the HTTP connection pool."""
        self._client.close()
