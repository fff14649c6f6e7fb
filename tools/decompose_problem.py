"""MCP tool `decompose_problem`: a model split into parts worth one kernel each, and (with `compose`) the
whole-model candidate composed back from the parts' verified candidates and verified end to end."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.decomposition.assemble import PartPick, write_composed
from kb_mcp.decomposition.decompose import (
    MANIFEST,
    PROBLEM,
    DecompositionError,
    PastTimeLimit,
    decompose_many,
    foreign_entries,
    holds_another_problem,
    load,
    write,
)
from kb_mcp.decomposition.limits import MAX_TIME_LIMIT_S, MIN_TIME_LIMIT_S, TIME_LIMIT_S
from kb_mcp.decomposition.models import Decomposition
from kb_mcp.harness.problem import Problem
from kb_mcp.harness.sandbox.sandbox import Sandbox
from kb_mcp.kb.errors import KbMcpError, decode_utf8, storage_error
from kb_mcp.tools import compile_and_verify
from kb_mcp.tools.base import Progress, ToolError, ToolMeta, gpu_lane_inside, no_progress
from kb_mcp.tools.context import ToolContext
from kb_mcp.tools.source import Source, read_problem

NAME = "decompose_problem"
DESCRIPTION = """\
Split a model (a KernelBench level-3 problem, or your own module in that format) into parts worth one
kernel each: a convolution or GEMM with its epilogue, a normalisation, an attention core, a recurrent
module, a pool, a pointwise chain. The model is traced in the sandbox at its real sizes without
allocating them; each part is written as a KernelBench problem of its own (`parts/partNN.py`, its
parameters at the model's names) and ranked by its share of the model's GPU time (estimated from FLOPs
and bytes on an H200's peaks; `share_basis` says so). Work on the parts in order of share with the
other tools, as on any level-1/2 problem (compile_and_verify, record_outcome). Then call again with
compose=true: the whole-model candidate is written from each part's best standard verdict in the KB
(a `faster` candidate; the reference part where none) as an ordinary candidate file (`composed.py`,
readable and editable) and verified end to end by compile_and_verify in composed mode; its
`verification.record.candidate_id` goes to record_outcome like any other."""

META = ToolMeta(
    title="Decompose a model into parts (and compose them back)",
    uses_gpu=True,  # with compose, the composed candidate is verified and timed (the harness takes the lane)
    # writes the parts (and with compose, a verdict in the KB); decomposing again writes the same files
    idempotent=False,
)


class Request(BaseModel):
    """The model, where its parts go, and whether to compose them back."""

    model_config = ConfigDict(extra="forbid")

    problem: Source = Field(description="the model: its source text, or a path to a KernelBench problem file on the "
                            "server's machine (over HTTP read only inside the folders the server's operator allows)")
    out_dir: str | None = Field(None, description="folder for the parts, under the KB's folder for decompositions "
                                "(a name relative to it, or a path inside it; default: <problem>-<hash> there); "
                                "an existing decomposition of this problem there is reused")
    compose: bool = Field(False, description="write the whole-model candidate from the parts' best verified "
                          "candidates and verify it in composed mode")
    verify: bool = Field(True, description="with compose: verify the composed candidate (false: only write it)")
    top: int = Field(10, ge=1, le=500, description="how many parts to list, largest share first")
    timeout_s: float = Field(TIME_LIMIT_S, ge=MIN_TIME_LIMIT_S, le=MAX_TIME_LIMIT_S,
                             description="seconds the model's own code may run in the sandbox while it is traced, "
                             "and again while it is split into parts, before it is stopped (a model that never "
                             "returns); raise it for a model that is only slow to build")


class PartSummary(BaseModel):
    """One part, as the ranking lists it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    kind: str
    label: str
    share: float = Field(description="of the model's GPU time, 0..1, in every place the model runs this file")
    file: str = Field(description="the part's problem file (absolute path)")
    same_file: list[str] = Field(default_factory=list, description="the other parts that run this same file (the "
                                 "same computation on the same tensors, as an unrolled RNN's steps): one verdict "
                                 "on the file serves them all")


class LayerSummary(BaseModel):
    """A layer that runs in several part files, listed once."""

    model_config = ConfigDict(extra="forbid")

    kind: str
    label: str
    share: float = Field(description="of the model's GPU time, 0..1, in all the layer's places")
    places: int = Field(description="places in the model that run it")
    files_total: int = Field(description="part files those places are in (each verified on its own)")
    files: list[str] = Field(description="the first of those files (absolute paths, up to 5)")


class Result(BaseModel):
    """The decomposition, and the composition where asked."""

    model_config = ConfigDict(extra="forbid")

    problem: str
    out_dir: str
    method: str = Field(description="fx | export | whole: how the model was traced")
    failures: list[str] = Field(default_factory=list, description="why the tracers before `method` failed")
    parts_total: int
    files_total: int = Field(description="distinct part files (fewer than parts where places share one)")
    share_basis: str
    parts: list[PartSummary] = Field(description="each part file once, largest share first (up to `top`)")
    layers: list[LayerSummary] = Field(default_factory=list, description="layers the model runs in several part "
                                       "files (an output layer over an input's steps, each step's part taking its "
                                       "own piece), each once with the share of all its places, largest first")
    composed_file: str | None = None
    picks: list[PartPick] = Field(default_factory=list, description="with compose: what each part took")
    verification: compile_and_verify.Result | None = None
    next_step: str = ""


def decompositions_dir(ctx: ToolContext) -> Path:
    """The KB's folder for decompositions: the only place an MCP caller's `out_dir` may name."""
    return ctx.artifacts_dir / "decompositions"


def default_dir(ctx: ToolContext, problem: Problem) -> Path:
    """Where a problem's parts go when the caller names no folder: beside the KB, by name and hash."""
    return decompositions_dir(ctx) / f"{problem.name}-{problem.hash}"


def caller_dir(ctx: ToolContext, out_dir: str) -> Path:
    """The caller's `out_dir`, which must lie inside the KB's folder for decompositions (links resolved,
    `..` refused): an MCP client, over HTTP too, chooses it, and the tool writes there."""
    root = decompositions_dir(ctx).resolve()
    out = (root / Path(out_dir).expanduser()).resolve()  # an absolute out_dir replaces root
    if out == root or not out.is_relative_to(root):
        raise ToolError(f"out_dir {out_dir!r} is outside the KB's folder for decompositions: name a folder "
                        f"under {root} (a name relative to it will do), or leave out_dir out")
    return out


def refuse_to_write_over(out: Path, problem: Problem) -> None:
    """Raises ToolError when `out` holds anything but this problem's decomposition: files a
    decomposition does not write (links too), or another problem's decomposition."""
    if holds_another_problem(out, problem.source):
        raise ToolError(f"{out} holds the decomposition of another problem (or of another version of this one); "
                        "name a new folder as out_dir, or leave out_dir out (the default folder is per problem)")
    foreign = foreign_entries(out)
    if foreign:
        raise ToolError(f"{out} holds files a decomposition does not write ({', '.join(foreign[:5])}); it is not "
                        "written over: name a new folder as out_dir, or leave out_dir out")


def decomposed(problem: Problem, out: Path, sandbox: Sandbox | None = None, timeout_s: float = TIME_LIMIT_S,
               say: Callable[[str], None] = lambda message: None) -> Decomposition:
    """The decomposition written in `out` for this problem, made (in the sandbox, its code stopped after
    `timeout_s` in each step) where there is none, or made again where the problem changed; `say` hears
    what it does and how long the trace took. A folder holding another problem's decomposition is
    refused (ToolError): decomposing there would overwrite its parts and the work on them."""
    held = held_decomposition(out)
    kept = out / PROBLEM
    if held is not None and kept.is_file() and kept.read_text() == problem.source:
        say(f"{problem.name}: its decomposition in {out} is reused (the same source)")
        return held
    if held is not None and held.problem != problem.name:
        raise ToolError(
            f"{out} holds the decomposition of another problem, {held.problem!r} (its {MANIFEST}), not of "
            f"{problem.name!r}: decomposing {problem.name!r} there would overwrite its parts. Name another folder "
            f"for the parts of {problem.name!r}, or move {out} aside to decompose it there")
    say(f"tracing {problem.name} in the sandbox (time limit {timeout_s:g} s)...")
    started = time.monotonic()
    (result,) = decompose_many([(problem.name, problem.source)], sandbox, timeout_s=timeout_s)
    if isinstance(result, DecompositionError):
        raise refusal(problem, result)
    say(f"traced and split {problem.name} in {time.monotonic() - started:.1f} s")
    decomp, files = result
    write({**files, PROBLEM: problem.source}, out)
    return decomp


def refusal(problem: Problem, error: DecompositionError) -> KbMcpError:
    """The error a failed decomposition is answered with, by whose it is: the problem's (ToolError: the
    caller fixes the problem file), or ours (a model the decomposition cannot split faithfully: the
    action says how its author gets around it)."""
    message = f"the problem {problem.path or '(given as source text)'} could not be decomposed: {error}"
    if error.whose != "caller":
        return KbMcpError(message, action=error.action)
    return ToolError(message + (f". {RAISE_THE_LIMIT}" if isinstance(error, PastTimeLimit) else ""),
                     action=error.action)


RAISE_THE_LIMIT = (f"If the model is only slow to build or trace, raise the limit (up to {MAX_TIME_LIMIT_S:g} s): "
                   "`--timeout SECONDS` for kb-mcp decompose and kb-mcp compose, `timeout_s` in a decompose_problem "
                   "request; if it never returns (a loop that waits for something that does not come), fix the "
                   "problem file")
"""How the limit a problem ran past is raised, wherever it was set."""


def held_decomposition(out: Path) -> Decomposition | None:
    """The decomposition a folder holds (its manifest), None where it holds none; ToolError where its
    manifest is not one kb-mcp can read (the folder was named by the caller: another folder will do)."""
    if not (out / MANIFEST).is_file():
        return None
    try:
        return load(out)
    except ValueError as exc:  # not JSON, not UTF-8, not a decomposition (pydantic's errors are ValueErrors)
        raise ToolError(f"{out / MANIFEST} is not a decomposition this kb-mcp can read ({type(exc).__name__}); "
                        f"name another folder for the parts, or move {out} aside") from exc
    except OSError as exc:
        raise storage_error(exc, "read", out / MANIFEST) from exc


def read_composed(path: Path) -> str:
    """The text of the composed candidate the server wrote (an unreadable one is the machine's fault)."""
    try:
        return decode_utf8(path.read_bytes(), path)
    except OSError as exc:
        raise storage_error(exc, "read the composed candidate", path) from exc


@gpu_lane_inside
def run(ctx: ToolContext, req: Request, progress: Progress = no_progress) -> Result:
    """Decomposes the problem (or reuses its decomposition); with compose, composes and verifies.
    The folder is the caller's `out_dir` inside the KB's folder for decompositions, or the default
    one there, and holds nothing but this problem's decomposition."""
    problem = read_problem(req.problem, ctx.files)
    _ = ctx.store  # the KB first: artifacts never land beside no KB
    out = caller_dir(ctx, req.out_dir) if req.out_dir else default_dir(ctx, problem)
    refuse_to_write_over(out, problem)
    return _run(ctx, req, problem, out, progress)


def run_in(ctx: ToolContext, req: Request, out: Path, progress: Progress = no_progress) -> Result:
    """`run` in a folder the operator chose (`kb-mcp compose --parts`, a model campaign's folder): it
    need not lie in the KB's folder for decompositions, and a changed model is decomposed again
    there. `req.out_dir` is not read."""
    problem = read_problem(req.problem, ctx.files)
    _ = ctx.store  # the KB first: artifacts never land beside no KB
    return _run(ctx, req, problem, out, progress)


def _run(ctx: ToolContext, req: Request, problem: Problem, out: Path, progress: Progress) -> Result:
    progress(0, 2, "decomposing")
    decomp = decomposed(problem, out, ctx.sandbox, req.timeout_s, lambda message: progress(0, 2, message))
    files = decomp.by_file()
    parts = [PartSummary(name=p.name, kind=p.kind, label=p.label, share=round(share, 4), file=str(out / p.file),
                         same_file=others) for p, share, others in files[: req.top]]
    layers = [LayerSummary(kind=heads[0].kind, label=heads[0].label, share=round(share, 4), places=places,
                           files_total=len(heads), files=[str(out / h.file) for h in heads[:5]])
              for heads, share, places in decomp.by_layer()[: req.top]]
    result = Result(problem=problem.name, out_dir=str(out), method=decomp.method, failures=decomp.failures,
                    parts_total=len(decomp.parts), files_total=len(files), share_basis=decomp.share_basis, parts=parts,
                    layers=layers,
                    next_step=f"optimize the parts in order of share (start with {parts[0].file}), then call "
                              "decompose_problem again with compose=true")
    if not req.compose:
        return result
    progress(1, 2, "composing")
    with ctx.store.read() as view:
        composition = write_composed(out, view, ctx.candidates_dir)
    result.composed_file, result.picks = composition.file, composition.picks
    result.next_step = f"edit {composition.file} or verify it with compile_and_verify (mode composed)"
    if req.verify:
        # The composed file is the server's own (in the KB's folder), not one the caller named: it is
        # read here, not through the caller's file access, and the problem is the one already read.
        candidate = read_composed(Path(composition.file))
        check = compile_and_verify.Request(problem=problem.source, candidate=candidate, mode="composed")
        compile_and_verify.check_options(check)
        result.verification = compile_and_verify.verify_read(ctx, check, problem, candidate, progress)
        result.next_step = f"record_outcome with candidate_id {result.verification.record.candidate_id}; " \
                           f"{result.verification.next_step}"
    progress(2, 2, "composed")
    return result

