"""The precision a candidate's kernels compute in, read from their SASS (server side, no torch).

A candidate's outputs can pass the tolerance while its kernels compute in a lower precision than
its track allows: an output with a large offset (its RMS dominated by a constant) hides TF32's
~1e-3 relative error in a strict 1e-4 check. The machine code says what the tensor cores were
asked to do, whatever the output looks like. `cuobjdump -sass` lists every kernel of a cubin, an
object file or a shared library; the tensor-core instructions name their input type:

* `HMMA.<shape>.<acc>.TF32` (Ampere and later `mma.sync`/`wmma` on TF32), `HGMMA.<shape>.F32.TF32`
  (Hopper `wgmma`): TF32.
* `HMMA...BF16`, `HGMMA...BF16`: bfloat16.
* `HMMA.<shape>.F32` / `HMMA.<shape>.F16` and `HGMMA.<shape>.F32` without an input type: fp16
  (the default input type of the instruction).
* `QGMMA...E4M3/E5M2` and `HMMA...E4M3/E5M2`: fp8. `IMMA`, `IGMMA`: int8/int4.
* `DMMA` (fp64) is not a lowering.

Which precisions a verification allows (`allowed`): those of its track (`fp32` none; `tf32` TF32;
`bf16` TF32 and bf16; `fp16` TF32 and fp16), and those no lower than the problem's own floating
dtype (a bf16 problem computes in bf16 on the strict track too). No track allows fp8 or integer
tensor-core math as such. Packed half arithmetic outside the tensor cores (`HFMA2`) is not
read: ptxas also uses `HFMA2.MMA` to move constants in plain fp32 code.

The SASS decides which kernels need more evidence, not the verdict (`precision_check`): an
error-compensated scheme (3xTF32, BF16x9) computes on TF32 or bf16 instructions at float32's
accuracy (an emulation on fp8 or integer instructions could too), so kernels beyond what the track
allows get precision probes (`harness.judgment.probing`, run on a GPU by
`harness.worker.probes`), whose numbers decide (`precision_findings`). Without a GPU the check stays
pending and the verdict says the probes will judge it.

`Disassembler` runs `cuobjdump` in the sandbox (role `compiler`, the file copied into a scratch
folder of its own), never in the server's process, and caches the precisions found per file
content. The fixtures of `tests/harness/data/sass` are real `cuobjdump -sass` output of sm_90a
cubins built by nvcc.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.harness.judgment.probing import PrecisionCheck, kernel_list
from kb_mcp.harness.judgment.verdict import Finding, FindingCode
from kb_mcp.kb.atomic import write_atomic
from kb_mcp.kb.models import Track

PRECISIONS = ("tf32", "bf16", "fp16", "fp8", "int8")
"""Lowered precisions the SASS can show (every one is below fp32)."""

TRACK_ALLOWS: dict[Track, frozenset[str]] = {
    Track.fp32: frozenset(),
    Track.tf32: frozenset({"tf32"}),
    Track.bf16: frozenset({"tf32", "bf16"}),
    Track.fp16: frozenset({"tf32", "fp16"}),
}
# A problem whose own tensors are half precision computes in it on every track.
DTYPE_ALLOWS: dict[str, frozenset[str]] = {
    "float16": frozenset({"tf32", "fp16"}),
    "bfloat16": frozenset({"tf32", "bf16"}),
}

_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
_TENSOR_OP = re.compile(r"\b(HMMA|HGMMA|QGMMA|IMMA|IGMMA|OMMA)\.([A-Z0-9x.]+)")


def instruction_precision(op: str, modifiers: str) -> str | None:
    """The lowered precision of one tensor-core instruction (`HGMMA`, `64x64x8.F32.TF32`), or None."""
    parts = set(modifiers.split("."))
    if op in ("IMMA", "IGMMA"):
        return "int8"
    if op in ("QGMMA", "OMMA") or parts & {"E4M3", "E5M2", "E2M1", "E3M2", "E2M3"}:
        return "fp8"
    if "TF32" in parts:
        return "tf32"
    if "BF16" in parts:
        return "bf16"
    return "fp16"  # HMMA / HGMMA without an input type: half precision inputs


def sass_precisions(sass: str) -> dict[str, list[str]]:
    """Per kernel (its symbol as cuobjdump names it), the lowered precisions its tensor-core
    instructions compute in; kernels without any are left out."""
    found: dict[str, set[str]] = {}
    kernel = ""
    for line in sass.splitlines():
        m = _FUNCTION.match(line)
        if m:
            kernel = m.group(1)
            continue
        for op, mods in _TENSOR_OP.findall(line):
            p = instruction_precision(op, mods)
            if p is not None:
                found.setdefault(kernel, set()).add(p)
    return {k: sorted(v, key=PRECISIONS.index) for k, v in found.items()}


class PrecisionEvidence(BaseModel):
    """What the SASS of a candidate's built code shows: kernels that use lowered-precision tensor
    cores, per binary (an extension or an NVRTC unit)."""

    model_config = ConfigDict(extra="forbid")

    kernels: dict[str, list[str]] = Field(default_factory=dict)  # kernel symbol -> precisions
    read: list[str] = Field(default_factory=list)  # the units whose SASS was read
    unread: list[str] = Field(default_factory=list)  # units that could not be read, with why

    def merge(self, unit: str, kernels: dict[str, list[str]] | None, why: str = "") -> None:
        """Adds one unit's kernels (None: its SASS could not be read, `why` says so)."""
        if kernels is None:
            self.unread.append(f"{unit}: {why}" if why else unit)
            return
        self.read.append(unit)
        for k, ps in kernels.items():
            self.kernels[k] = sorted(set(self.kernels.get(k, [])) | set(ps), key=PRECISIONS.index)

    @property
    def precisions(self) -> set[str]:
        """Every lowered precision any kernel uses."""
        return {p for ps in self.kernels.values() for p in ps}


def allowed(track: Track, dtypes: Iterable[str] = ()) -> frozenset[str]:
    """Lowered precisions a candidate may compute in on `track` for a problem whose floating
    tensors have `dtypes` (torch names without `torch.`)."""
    out = set(TRACK_ALLOWS[track])
    for d in dtypes:
        out |= DTYPE_ALLOWS.get(d, frozenset())
    return frozenset(out)


_NAMED_DTYPES = {"bfloat16": re.compile(r"\bbfloat16\b|\.bfloat16\(|\bbf16\b"),
                 "float16": re.compile(r"\bfloat16\b|\bhalf\b|\.half\(|\bfp16\b")}


def dtypes_named(problem_source: str) -> list[str]:
    """Half-precision dtypes a problem's source names (the compile-only path runs nothing of the
    problem's inputs, so it reads its dtypes from the text; the GPU path sees the tensors)."""
    return [d for d, pattern in _NAMED_DTYPES.items() if pattern.search(problem_source)]


def evidence_of(units: Iterable[object]) -> PrecisionEvidence:
    """The evidence of compiled units (`verdict.CompileUnit`s whose SASS was read)."""
    ev = PrecisionEvidence()
    for u in units:
        kernels = getattr(u, "precisions", None)
        if getattr(u, "ok", False):
            ev.merge(str(getattr(u, "name", "")), kernels, "" if kernels is not None else "SASS not read")
    return ev


def beyond_track(evidence: PrecisionEvidence | None, track: Track, dtypes: Iterable[str] = ()) -> dict[str, list[str]]:
    """Per kernel, the lowered precisions its SASS shows that the track (and the problem's own
    dtypes) does not allow; kernels within the track are left out."""
    if evidence is None:
        return {}
    ok = allowed(track, list(dtypes))
    bad = {k: [p for p in ps if p not in ok] for k, ps in evidence.kernels.items()}
    return {k: ps for k, ps in bad.items() if ps}


def precision_check(evidence: PrecisionEvidence | None, track: Track,
                    dtypes: Iterable[str] = ()) -> PrecisionCheck | None:
    """The pending precision check of the kernels beyond the track (None: none is): the probes
    decide it on a GPU (`harness.worker.probes`), the compile-only path leaves it pending."""
    bad = beyond_track(evidence, track, dtypes)
    return PrecisionCheck(track=track, kernels=bad) if bad else None


def precision_findings(check: PrecisionCheck | None, dtypes: Iterable[str] = ()) -> list[Finding]:
    """`precision_lowered` when the probes found the kernels less accurate than the track's
    reference (with their evidence), or when no probe could judge them (then the SASS alone
    decides, as it did before probes existed); nothing while pending or passed."""
    if check is None or check.status in ("pending", "passed"):
        return []
    kinds = check.precisions
    fits = [t.value for t in Track if set(kinds) <= allowed(t, list(dtypes))]
    where = f"verify it in the {' or '.join(fits)} track" if fits else "no track allows it"
    sass = (f"the kernels {kernel_list(check.kernels)} compute on the tensor cores in {'/'.join(kinds)} (their "
            "SASS)")
    if check.status == "failed":
        message = (f"{sass}, and the precision probes show {check.scheme()}; {check.evidence()}. Compute in the "
                   f"track's precision, compensate the lowered operands (split each into a high part and a "
                   f"remainder, sum the cross products, small terms first), or {where}")
    else:
        message = (f"{sass}, which the {check.track.value} track does not allow, even where the outputs pass its "
                   f"tolerance, and the precision probes could not judge them ({check.note}); compute in the "
                   f"track's precision, or {where}")
    return [Finding(code=FindingCode.precision_lowered, source="runtime" if check.probes else "static",
                    message=message)]


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:32]


class Disassembler:
    """`cuobjdump -sass` on built binaries, each run in the sandbox; precisions cached per content."""

    def __init__(self, cache_dir: Path, sandbox: object, cuobjdump: str | None, nvdisasm: str | None = None) -> None:
        """`sandbox` is a `harness.sandbox.sandbox.Sandbox`; `cuobjdump` the tool's path (None: none found),
        `nvdisasm` the disassembler it runs (found on the sandbox's PATH when not given)."""
        self.store = cache_dir / "sass"
        self.sandbox = sandbox
        self.cuobjdump = cuobjdump
        self.nvdisasm = nvdisasm

    def precisions(self, binary: Path, timeout_s: float = 120.0) -> tuple[dict[str, list[str]] | None, str]:
        """(kernel -> precisions, "") of one cubin, object or shared library, or (None, why not)."""
        if self.cuobjdump is None:
            return None, "cuobjdump not found (install the CUDA toolkit or nvidia-cuda-cuobjdump)"
        try:
            key = _digest(binary)
        except OSError as exc:
            return None, f"unreadable: {exc}"
        hit = self.store / f"{key}.json"
        try:
            return {str(k): list(v) for k, v in json.loads(hit.read_text()).items()}, ""
        except (OSError, ValueError, AttributeError):
            pass
        code, text = self._run(binary, timeout_s)
        if code != 0:
            return None, f"cuobjdump exited {code}: {text.strip()[-300:]}"
        found = sass_precisions(text)
        self.store.mkdir(parents=True, exist_ok=True)
        write_atomic(hit, json.dumps(found))  # a temp file per writer (threads too)
        return found, ""

    def _run(self, binary: Path, timeout_s: float) -> tuple[int, str]:
        from kb_mcp.harness.sandbox.sandbox import Grant, Sandbox
        from kb_mcp.harness.sandbox.scratch import new_scratch

        assert isinstance(self.sandbox, Sandbox)
        scratch = new_scratch("sass")
        try:
            name = "unit" + (binary.suffix if binary.suffix in (".so", ".o", ".cubin") else "")
            shutil.copyfile(binary, scratch / name)
            env = (("NVDISASM_PATH", str(Path(self.nvdisasm).parent)),) if self.nvdisasm else ()
            return self.sandbox.run([str(self.cuobjdump), "-sass", name],
                                    Grant(role="compiler", scratch=scratch, env=env), timeout_s=timeout_s)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
