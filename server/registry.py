"""Which tool modules the server exposes, and the one shape they all take once loaded.

Every tool module under `kb_mcp.tools` follows the convention in docs/architecture.md
(NAME, DESCRIPTION, Request, Result, run). `ToolSpec` is that convention as a value, so the
server, the job runner and `kb-mcp call` handle every tool the same way and never hand-write a
schema: input and output schemas always come from the module's own pydantic models.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from pydantic import BaseModel

from kb_mcp.tools.base import GPU_LANE_ATTR, Progress, ToolMeta

log = logging.getLogger(__name__)

TOOL_MODULES: tuple[str, ...] = (
    "kb_mcp.tools.profile_kernel",
    "kb_mcp.tools.classify_state",
    "kb_mcp.tools.suggest_optimizations",
    "kb_mcp.tools.compile_and_verify",
    "kb_mcp.tools.record_outcome",
    "kb_mcp.tools.decompose_problem",
)
"""The six tools: the five of one optimization round, in its order, then the one for whole models."""

JOB_ONLY_MODULES: dict[str, str] = {"run_campaign": "kb_mcp.campaign.job"}
"""Job kinds that run only as jobs (work far longer than any client's tool timeout), by kind name:
the module (tool convention) that implements it. Imported when a job of that kind is first
started, not at server start (the campaign pulls in the LLM client, about a second of imports).
Code can also call `kb_mcp.server.jobs.register_job_kind`."""

REQUIRED_ATTRS = ("NAME", "DESCRIPTION", "Request", "Result", "run")
"""A module without META gets `ToolMeta(title=NAME)`: no hints, no GPU (the five tools declare theirs)."""


class ToolModuleError(TypeError):
    """A module that does not follow the tool convention; the message names what is missing."""


RunFn = Callable[[Any, Any, Progress], BaseModel]


@dataclass(frozen=True)
class ToolSpec:
    """One tool (or job kind): its name, LLM-facing description, request/result models and function."""

    name: str
    description: str
    request: type[BaseModel]
    result: type[BaseModel]
    run: RunFn
    meta: ToolMeta
    module: str = ""

    def input_schema(self) -> dict[str, Any]:
        """The MCP tool's input schema: the Request model's JSON schema, titled after the tool."""
        schema = self.request.model_json_schema()
        schema["title"] = f"{self.name} arguments"
        return schema

    @property
    def uses_gpu(self) -> bool:
        """Times or profiles on the GPU (its run holds the process's GPU lane)."""
        return self.meta.uses_gpu

    @classmethod
    def from_module(cls, module: ModuleType) -> ToolSpec:
        """Reads the convention's attributes from `module`; raises ToolModuleError if any is wrong."""
        missing = [attr for attr in REQUIRED_ATTRS if not hasattr(module, attr)]
        if missing:
            raise ToolModuleError(f"{module.__name__}: missing {', '.join(missing)} (see docs/architecture.md, Tools)")
        request, result = module.Request, module.Result
        for label, model in (("Request", request), ("Result", result)):
            if not (isinstance(model, type) and issubclass(model, BaseModel)):
                raise ToolModuleError(f"{module.__name__}.{label} must be a pydantic BaseModel subclass")
        if not callable(module.run):
            raise ToolModuleError(f"{module.__name__}.run must be callable")
        name = str(module.NAME)
        meta = getattr(module, "META", None) or ToolMeta(title=name)
        if not isinstance(meta, ToolMeta):
            raise ToolModuleError(f"{module.__name__}.META must be a kb_mcp.tools.base.ToolMeta")
        on_lane = bool(getattr(module.run, GPU_LANE_ATTR, False))
        if meta.uses_gpu != on_lane:
            # The lane is taken inside run (so every caller takes it); the flag tells clients and
            # the banner. The two must agree, or a GPU tool would time beside another.
            raise ToolModuleError(
                f"{module.__name__}: META.uses_gpu is {meta.uses_gpu} but run is "
                f"{'' if on_lane else 'not '}decorated with kb_mcp.tools.base.on_gpu_lane (or gpu_lane_inside)"
            )
        return cls(
            name=name,
            description=str(module.DESCRIPTION).strip(),
            request=request,
            result=result,
            run=module.run,
            meta=meta,
            module=module.__name__,
        )


def load_specs(module_names: Iterable[str], *, strict: bool = False) -> list[ToolSpec]:
    """Imports each module and returns its ToolSpec.

    A module that is absent or broken is logged (stderr) and skipped unless `strict`, so one
    broken tool never takes the whole server down with it.
    """
    specs: list[ToolSpec] = []
    for name in module_names:
        try:
            specs.append(ToolSpec.from_module(importlib.import_module(name)))
        except Exception as exc:
            if strict:
                raise
            log.warning("tool module %s not loaded: %s: %s", name, type(exc).__name__, exc)
    return specs


def load_tools(*, strict: bool = False) -> list[ToolSpec]:
    """The five product tools (those whose modules import)."""
    return load_specs(TOOL_MODULES, strict=strict)
