"""GPU bring-up of the 3xTF32 wgmma solutions (bench/kernelbench_solutions/fp32_tc): our own files, run
in this process (no sandbox), printing each step and writing JSON.

    python bench/tc_fp32_check.py --compile-only            # no GPU: nvcc each solution for sm_90a (-Xptxas -v)
    python bench/tc_fp32_check.py --unit-only               # the GEMM core alone, small and odd shapes
    python bench/tc_fp32_check.py --unit                    # that first, then the problems
    python bench/tc_fp32_check.py --problems level1/17,level2/12 --skip-compile
    python bench/tc_fp32_check.py --unit --variants "STAGES=2;HI_IMPLICIT=1;FRESH_D=0" --json out.json

Per problem (its real size, from get_inputs()): error against a float64 copy of the reference on the
GPU, divided by the strict float32 reference's (TF32 off), on the problem's inputs and on inputs of
mixed signs and magnitudes; times (CUDA events, L2 flushed between runs, median) of eager and
torch.compile with TF32 off and of the candidate; GEMM TFLOP/s and the speedup over the better
baseline. A variant is a list of the core's compile-time switches (bench/tc_fp32/gemm_core.cu).

--ncu: to attribute the shared-memory (L1) traffic of the kernel on the level2/12 size (1024 x 8192
x 8192), base and one variant, each timed launch profiled (per variant: 2 error runs, 3 warm-ups,
--reps 1 timed; the kernel is gemm3x_kernel in every extension):

    ncu --target-processes all -k regex:gemm3x_kernel --launch-count 12 --section MemoryWorkloadAnalysis_Tables \
      --metrics l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,\
    l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,\
    l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm.sum,\
    l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,\
    l1tex__throughput.avg.pct_of_peak_sustained_active,\
    sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active \
      python bench/tc_fp32_check.py --problems level2/12 --variants "AREG=1" --skip-compile --reps 1

Per 128 x 128 x 32 stage the producer's stores are 64 KB (AREG: 48 KB, 384 wavefronts of 128 bytes);
the consumers' ldmatrix loads (AREG only) 16 KB, 128 wavefronts, no conflicts expected. The tensor
core's operand reads (A and B 144 KB, AREG: B 96 KB) are not LSU traffic: they appear in the L1
throughput and in the tables' shared-memory rows, not in the lsu counters. Metric names move
between Nsight Compute versions: `ncu --query-metrics --chip gh100 | grep -e shared -e gmma` lists
this one's.
"""

from __future__ import annotations

import argparse
import ast
import gc
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tc_fp32_sync as sync  # bench/ holds no package: the generator sits beside this script

ROOT = sync.ROOT
SOLUTIONS = sync.OUT
MANIFEST = SOLUTIONS / "manifest.json"
UNIT_SHAPES = ((128, 128, 32), (256, 384, 96), (128, 256, 256), (200, 132, 72), (1024, 1024, 1024),
               (1000, 520, 1028))
FLUSH_BYTES = 256 * 1024 * 1024


def say(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------------------------------------
# Sources and variants (no torch needed)

def parse_variants(text: str | None) -> list[dict[str, str]]:
    """"STAGES=3,HI_IMPLICIT=1;STAGES=2" -> [{}, {STAGES: 3, HI_IMPLICIT: 1}, {STAGES: 2}] (base first)."""
    out: list[dict[str, str]] = [{}]
    for chunk in (text or "").split(";"):
        if not chunk.strip():
            continue
        pairs = dict(p.split("=", 1) for p in chunk.split(",") if p.strip())
        out.append({k.strip(): v.strip() for k, v in pairs.items()})
    return out


def variant_name(defines: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(defines.items())) or "base"


def with_variant(cuda: str, defines: dict[str, str]) -> str:
    """The CUDA source with `defines` at the variant marker (before the core's defaults)."""
    if sync.VARIANT_MARK not in cuda:
        raise ValueError("the CUDA source has no variant marker")
    lines = "".join(f"#define {k} {v}\n" for k, v in sorted(defines.items()))
    return cuda.replace(sync.VARIANT_MARK, lines + sync.VARIANT_MARK, 1)


def string_constants(path: Path) -> dict[str, str]:
    """Module-level string assignments of a solution file (CPP, CUDA, _EXT_NAME)."""
    found: dict[str, str] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    found[t.id] = node.value.value
    return found


def smem_bytes(cuda: str) -> int:
    """The kernel's dynamic shared memory, from the variant's switches (the defines before the marker)
    and the core's defaults."""
    chosen = cuda.split(sync.VARIANT_MARK, 1)[0]

    def value(name: str, default: int) -> int:
        m = re.search(rf"^#define {name} (\d+)", chosen, re.M)
        return int(m.group(1)) if m else default
    b_kn = re.search(r"^#define B_KN 1", cuda, re.M) is not None  # the solution's, after the marker
    tma, bk = value("TMA", 0 if b_kn else 1), value("BK", 32)
    stages = value("STAGES", (2 if bk == 64 else 4) if tma else 3)
    tiles = 3 if value("AREG", 1) or tma else 4  # AREG, TMA: A once, unsplit, beside B_hi and B_lo
    return stages * tiles * 128 * bk * 4 + (3 if tma else 2) * stages * 8


def nvcc_report(cuda: str, workdir: Path) -> dict[str, Any]:
    """nvcc for sm_90a with -Xptxas -v: registers, spills, errors."""
    src = workdir / "cuda.cu"
    src.write_text(cuda)
    argv = ["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-std=c++17", "-c", "-Xptxas", "-v",
            "-o", str(workdir / "cuda.o"), str(src)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    regs = re.findall(r"Used (\d+) registers", log)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return {"ok": proc.returncode == 0, "registers": int(regs[-1]) if regs else None,
            "spill_bytes": sum(int(a) + int(b) for a, b in spills), "smem_bytes": smem_bytes(cuda),
            "warnings": [ln for ln in log.splitlines() if "warning" in ln.lower()],
            "log": log if proc.returncode else ""}


def compile_only(paths: list[Path], variants: list[dict[str, str]]) -> list[dict[str, Any]]:
    """nvcc each solution's CUDA source (and each variant of the first) and print the figures; the
    compilers run side by side, one per core (each is one single-threaded process)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [(p, v) for p in paths for v in variants[:1]] + [(paths[0], v) for v in variants[1:]]

        def one(i: int) -> dict[str, Any]:
            path, defines = jobs[i]
            (Path(tmp) / str(i)).mkdir()
            return nvcc_report(with_variant(string_constants(path)["CUDA"], defines), Path(tmp) / str(i))

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            reports = list(pool.map(one, range(len(jobs))))
        for (path, defines), rep in zip(jobs, reports):
            rep.update(solution=rel(path), variant=variant_name(defines))
            rows.append(rep)
            status = "ok" if rep["ok"] else "FAILED"
            say(f"[compile] {rel(path)} [{rep['variant']}]: {status}, {rep['registers']} registers, "
                f"{rep['spill_bytes']} spill bytes, {rep['smem_bytes'] // 1024} KB smem"
                + "".join(f"\n    {w}" for w in rep["warnings"]) + (f"\n{rep['log']}" if rep["log"] else ""))
    return rows


def rel(path: Path) -> str:
    return path.relative_to(SOLUTIONS).as_posix() if path.is_relative_to(SOLUTIONS) else str(path)


def variant_file(path: Path, defines: dict[str, str], folder: Path) -> Path:
    """A copy of solution `path` with `defines` in its CUDA source and an extension name of its own."""
    text = path.read_text()
    consts = string_constants(path)
    if defines:
        tag = hashlib.sha1(variant_name(defines).encode()).hexdigest()[:8]
        text = text.replace(f'_EXT_NAME = "{consts["_EXT_NAME"]}"', f'_EXT_NAME = "{consts["_EXT_NAME"]}_{tag}"', 1)
        text = text.replace(sync.VARIANT_MARK, with_variant(sync.VARIANT_MARK, defines), 1)
    out = folder / f"{path.parent.name}_{path.stem}_{variant_name(defines).replace('=', '').replace(',', '_')}.py"
    out.write_text(text)
    return out


def import_file(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build_one(path: str) -> str:
    """Imports (so builds) one solution copy in a worker process; returns an error or ""."""
    try:
        import_file(Path(path), "tc_build_" + Path(path).stem)
        return ""
    except Exception as exc:  # noqa: BLE001 - the report names the failure; the main process retries it
        return f"{type(exc).__name__}: {exc}"


def prebuild(files: list[Path], jobs: int) -> None:
    """Builds the extensions in parallel processes; the later imports find them built."""
    t0 = time.perf_counter()
    os.environ.setdefault("MAX_JOBS", "2")
    import multiprocessing

    with ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=multiprocessing.get_context("spawn")) as pool:
        for f, err in zip(files, pool.map(_build_one, [str(f) for f in files])):
            say(f"[build] {f.name}: {'ok' if not err else err.splitlines()[0][:300]}")
    say(f"[build] {len(files)} extensions in {time.perf_counter() - t0:.0f} s")


def unit_file(b_kn: bool, defines: dict[str, str], folder: Path) -> Path:
    """A module building the bare core (identity epilogue) in one orientation, as the solutions build."""
    cpp, cuda = sync.unit_sources(b_kn)
    tag = hashlib.sha1(variant_name(defines).encode()).hexdigest()[:8]
    name = f"{sync.EXT_PREFIX}unit_{'kn' if b_kn else 'nk'}_{tag}"
    text = ("from torch.utils.cpp_extension import load_inline\n\n"
            f'CPP = r"""{cpp}"""\n\nCUDA = r"""{with_variant(cuda, defines)}"""\n\n'
            f'_ext = load_inline(name="{name}", cpp_sources=CPP, cuda_sources=CUDA, no_implicit_headers=True,\n'
            '                   extra_cuda_cflags=["-O3"])\n')
    out = folder / f"unit_{'kn' if b_kn else 'nk'}_{variant_name(defines).replace('=', '').replace(',', '_')}.py"
    out.write_text(text)
    return out


# ---------------------------------------------------------------------------------------------
# GPU helpers (torch imported lazily: --compile-only runs without it)

def strict_fp32() -> None:
    """The strict fp32 track's settings: no TF32 anywhere."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def gpu_time(fn: Any, reps: int, flush: Any) -> float:
    """Median milliseconds of fn() over reps runs, L2 flushed (256 MB written) before each."""
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def describe_mismatch(c: Any, ref: Any, bad: Any, a: Any, b_kn_mat: Any) -> list[str]:
    """Where a unit result is wrong, in terms that point at a layout or pipeline bug."""
    import torch

    rows, cols = torch.nonzero(bad, as_tuple=True)
    lines = [f"{int(bad.sum())} of {bad.numel()} bad; first at row {int(rows[0])}, col {int(cols[0])}"]
    bad_rows = torch.unique(rows)
    bad_cols = torch.unique(cols)
    lines.append(f"bad rows {bad_rows.numel()}/{bad.shape[0]}, bad cols {bad_cols.numel()}/{bad.shape[1]}")
    for what, idx, period in (("row % 128 // 8", rows % 128 // 8, 16), ("row % 8", rows % 8, 8),
                              ("col % 128 // 8", cols % 128 // 8, 16), ("col % 8", cols % 8, 8)):
        hist = torch.bincount(idx, minlength=period).tolist()
        lines.append(f"by {what}: {hist}")
    for r in bad_rows[:4].tolist():  # a row of c equal to another row of ref: rows permuted
        near = torch.cdist(c[r:r + 1].double(), ref.double()).argmin().item()
        lines.append(f"c row {r} is nearest ref row {near}")
    for col in bad_cols[:4].tolist():
        near = torch.cdist(c[:, col:col + 1].double().T, ref.double().T).argmin().item()
        lines.append(f"c col {col} is nearest ref col {near}")
    k = a.shape[1]
    if k <= 512:  # one K stage (32) missing or counted twice
        for j in range(0, k, 32):
            part = a[:, j:j + 32].double() @ b_kn_mat[j:j + 32].double()
            for sign, what in ((-1, "missing"), (1, "counted twice")):
                if torch.allclose(c.double(), ref + sign * part, rtol=1e-4, atol=1e-3):
                    lines.append(f"c equals ref with K stage {j // 32} (k {j}..{j + 31}) {what}")
    return lines


def unit_case(ext: Any, b_kn: bool, m: int, n: int, k: int) -> dict[str, Any]:
    """One shape: the core against float64, beside the strict fp32 matmul's error."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(m * 7 + n * 3 + k)
    a = torch.rand(m, k, device="cuda", generator=g) * 2 - 1
    b = torch.rand(k, n, device="cuda", generator=g) * 2 - 1  # K x N; passed as b.T contiguous for NK
    b_arg = b.contiguous() if b_kn else b.T.contiguous()
    ref = a.double() @ b.double()
    c = ext.gemm3x(a, b_arg, 0.0, 0.0, 0.0, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    strict = a @ b
    err_c, err_s = (c.double() - ref).abs(), (strict.double() - ref).abs()
    ratio = float(err_c.max() / err_s.max().clamp_min(1e-30))
    row = {"shape": [m, n, k], "max_err": float(err_c.max()), "strict_max_err": float(err_s.max()),
           "ratio_max": ratio, "ratio_mean": float(err_c.mean() / err_s.mean().clamp_min(1e-30)), "ok": ratio < 8}
    if not row["ok"]:
        bad = err_c > 8 * err_s.max() + 1e-6
        row["diagnosis"] = describe_mismatch(c, ref, bad, a, b) if bool(bad.any()) else ["no element bad"]
    return row


def _context_broken(error: str) -> bool:
    """Whether an error is the device's (a CUDA error spoils the process's context), not a build's:
    a failed nvcc run also names CUDA paths, and the next variant or problem can still run after it."""
    device = "CUDA error" in error or "AcceleratorError" in error or "illegal" in error
    return device and "Error building" not in error


def run_unit(folder: Path, variants: list[dict[str, str]], jobs: int) -> list[dict[str, Any]]:
    """The bare core in both orientations, per variant, on UNIT_SHAPES."""
    files = {(v_name, b_kn): unit_file(b_kn, v, folder) for v in variants for b_kn in (False, True)
             for v_name in [variant_name(v)]}
    prebuild(list(files.values()), jobs)
    rows = []
    for (v_name, b_kn), f in files.items():
        orient = "K x N" if b_kn else "N x K"
        try:
            ext = import_file(f, f.stem)._ext
        except Exception as exc:  # noqa: BLE001 - reported; the other variants still run
            say(f"[unit] {v_name} B {orient}: build FAILED: {exc}")
            rows.append({"variant": v_name, "b_kn": b_kn, "error": str(exc)[-2000:]})
            continue
        for m, n, k in UNIT_SHAPES:
            try:
                row = unit_case(ext, b_kn, m, n, k)
            except Exception as exc:  # noqa: BLE001 - a crash is a result here
                row = {"shape": [m, n, k], "ok": False, "error": f"{type(exc).__name__}: {exc}"}
            row.update(variant=v_name, b_kn=b_kn)
            rows.append(row)
            head = f"[unit] {v_name} B {orient} {m}x{n}x{k}: "
            if "error" in row:
                say(head + "ERROR " + row["error"])
                if _context_broken(row["error"]):
                    say("[unit] the CUDA context is broken after a CUDA error: stopping the unit test")
                    return rows
                continue
            say(head + f"{'ok' if row['ok'] else 'BAD'} max err {row['max_err']:.3g} (fp32 strict "
                f"{row['strict_max_err']:.3g}), ratio max {row['ratio_max']:.2f} mean {row['ratio_mean']:.2f}")
            for line in row.get("diagnosis", []):
                say("    " + line)
    return rows


# ---------------------------------------------------------------------------------------------
# Problems

def kernelbench_dir(given: str | None) -> Path:
    """The KernelBench checkout: --kernelbench, $KERNELBENCH, or shared/kernelbench beside or in the repo."""
    for cand in (given, os.environ.get("KERNELBENCH"), ROOT / "shared" / "kernelbench",
                 ROOT.parent / "shared" / "kernelbench"):
        if cand and (Path(cand) / "level1").is_dir():
            return Path(cand)
    raise SystemExit("no KernelBench checkout found: pass --kernelbench PATH")


def selected(problems: str | None) -> list[dict[str, Any]]:
    """Manifest entries, all or those whose problem starts with one of the comma-separated prefixes
    (level2/12 matches level2/12_Gemm_Multiply_LeakyReLU.py)."""
    entries = json.loads(MANIFEST.read_text())["solutions"]
    if not problems:
        return list(entries)
    wanted = [p.strip() for p in problems.split(",") if p.strip()]
    return [e for e in entries if any(e["problem"].split("_")[0] == w.split("_")[0] for w in wanted)]


def gemm_flops(inputs: list[Any], model: Any) -> float:
    """2 M N K of the problem's one GEMM (its first input is M x K; N from the weight or from B)."""
    a = inputs[0]
    m, k = a.shape
    if len(inputs) > 1:
        b = inputs[1]
        n = b.shape[1] if b.shape[0] == k and b.shape[1] != k else b.shape[0]
    else:
        n = next(p for p in model.parameters() if p.dim() == 2).shape[0]
    return 2.0 * m * n * k


def error_ratios(new: Any, ref: Any, ref64: Any, inputs: list[Any]) -> dict[str, float]:
    """Candidate and strict fp32 errors against float64, and the harness's default tolerance test."""
    import torch

    with torch.no_grad():
        r64 = ref64(*[x.double() for x in inputs])
        strict = ref(*inputs)
        cand = new(*inputs)
    torch.cuda.synchronize()
    ec, es = (cand.double() - r64).abs(), (strict.double() - r64).abs()
    rms = strict.double().pow(2).mean().sqrt()
    within = bool(((cand.double() - strict.double()).abs() <= 1e-4 * rms + 1e-4 * strict.double().abs()).all())
    out = {"ratio_max": float(ec.max() / es.max().clamp_min(1e-30)),
           "ratio_mean": float(ec.mean() / es.mean().clamp_min(1e-30)),
           "max_err": float(ec.max()), "strict_max_err": float(es.max()), "within_1e-4": within}
    del r64, strict, cand, ec, es
    return out


def mixed_inputs(inputs: list[Any], seed: int) -> list[Any]:
    """Signs mixed and magnitudes 1/256..256 per element: values whose low bits matter."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for x in inputs:
        scale = torch.exp2(torch.randint(-8, 9, x.shape, device="cuda", generator=g).float())
        sign = torch.where(torch.rand(x.shape, device="cuda", generator=g) < 0.5, -1.0, 1.0)
        out.append((x * scale * sign).contiguous())
    return out


def baselines(ref: Any, inputs: list[Any], args: argparse.Namespace, flush: Any) -> dict[str, float | None]:
    """Eager and torch.compile times, TF32 off."""
    import torch

    res: dict[str, float | None] = {}
    with torch.no_grad():
        res["eager_ms"] = gpu_time(lambda: ref(*inputs), args.reps, flush)
        res["compile_ms"] = None
        if not args.skip_compile:
            try:
                compiled = torch.compile(ref)
                compiled(*inputs)
                res["compile_ms"] = gpu_time(lambda: compiled(*inputs), args.reps, flush)
            except Exception as exc:  # noqa: BLE001 - a failing torch.compile leaves eager as the baseline
                say(f"    torch.compile failed: {type(exc).__name__}: {str(exc)[:200]}")
    return res


def build_models(problem: ModuleType, module: ModuleType, seed: int) -> tuple[Any, Any, str]:
    """Model and ModelNew built from the same seed, as the harness builds them; the reference's state
    copied in when the names match. Returns (ref, new, note)."""
    import torch

    init = problem.get_init_inputs()
    torch.manual_seed(seed)
    ref = problem.Model(*init).cuda().eval()
    torch.manual_seed(seed)
    new = module.ModelNew(*init).cuda().eval()
    rs, ns = ref.state_dict(), new.state_dict()
    if set(rs) == set(ns):
        same = all(torch.equal(rs[k], ns[k]) for k in rs)
        new.load_state_dict(rs)
        return ref, new, "state dicts match" + ("" if same else " (values differed from the seed: copied)")
    return ref, new, f"state dict names differ: {sorted(rs)} vs {sorted(ns)} (seeded values kept)"


def run_problem(entry: dict[str, Any], files: dict[str, Path], kb: Path, args: argparse.Namespace,
                flush: Any) -> dict[str, Any]:
    """One problem: errors and times of every variant, the baselines once."""
    import copy

    import torch

    name = entry["problem"]
    problem = import_file(kb / name, "kb_problem_" + Path(name).stem)
    torch.manual_seed(args.seed + 1)
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in problem.get_inputs()]
    out: dict[str, Any] = {"problem": name, "shapes": [list(x.shape) for x in inputs], "variants": {}}
    ref = None
    for v_name, f in files.items():
        try:
            module = import_file(f, f.stem)
        except Exception as exc:  # noqa: BLE001 - a build the core refuses (or nvcc fails): the other variants run
            say(f"[{name}] [{v_name}] build FAILED: {type(exc).__name__}: {str(exc)[-600:]}")
            out["variants"][v_name] = {"error": f"build: {type(exc).__name__}: {exc}"[-4000:]}
            continue
        ref, new, note = build_models(problem, module, args.seed)
        say(f"[{name}] [{v_name}] {note}")
        ref64 = copy.deepcopy(ref).double()
        row: dict[str, Any] = {"own": error_ratios(new, ref, ref64, inputs),
                               "mixed": error_ratios(new, ref, ref64, mixed_inputs(inputs, args.seed))}
        del ref64
        with torch.no_grad():
            row["ms"] = gpu_time(lambda new=new: new(*inputs), args.reps, flush)
        out["variants"][v_name] = row
        flops = gemm_flops(inputs, ref)
        row["tflops"] = flops / row["ms"] / 1e9
        say(f"[{name}] [{v_name}] error/strict max {row['own']['ratio_max']:.2f} mean {row['own']['ratio_mean']:.2f}"
            f" (mixed inputs: max {row['mixed']['ratio_max']:.2f} mean {row['mixed']['ratio_mean']:.2f}),"
            f" within 1e-4 {row['own']['within_1e-4']}; {row['ms']:.3f} ms, {row['tflops']:.1f} TFLOP/s")
        del new
    if ref is None:
        raise RuntimeError("no variant of this solution built")
    out.update(baselines(ref, inputs, args, flush))
    out["gemm_flops"] = gemm_flops(inputs, ref)
    best = min(t for t in (out["eager_ms"], out["compile_ms"]) if t is not None)
    for v_name, row in out["variants"].items():
        if "error" in row:
            continue
        row["speedup"] = best / row["ms"]
        say(f"[{name}] [{v_name}] eager {out['eager_ms']:.3f} ms ({out['gemm_flops'] / out['eager_ms'] / 1e9:.1f}"
            f" TFLOP/s), compile {out['compile_ms'] or float('nan'):.3f} ms -> speedup {row['speedup']:.2f}x")
    return out


def run_problems(args: argparse.Namespace, variants: list[dict[str, str]], folder: Path) -> list[dict[str, Any]]:
    import torch

    kb = kernelbench_dir(args.kernelbench)
    entries = selected(args.problems)
    files = {e["problem"]: {variant_name(v): variant_file(SOLUTIONS / e["solution"], v, folder) for v in variants}
             for e in entries}
    prebuild([f for per in files.values() for f in per.values()], args.jobs)
    flush = torch.empty(FLUSH_BYTES // 4, device="cuda")
    results = []
    for e in entries:
        t0 = time.perf_counter()
        try:
            res = run_problem(e, files[e["problem"]], kb, args, flush)
        except Exception as exc:  # noqa: BLE001 - one problem's failure is reported; the others still run
            say(f"[{e['problem']}] FAILED: {type(exc).__name__}: {exc}")
            traceback.print_exc()
            res = {"problem": e["problem"], "error": f"{type(exc).__name__}: {exc}"[:4000]}
        res["seconds"] = round(time.perf_counter() - t0, 1)
        results.append(res)
        gc.collect()
        torch.cuda.empty_cache()
        if "error" in res and _context_broken(res["error"]):
            say("the CUDA context is broken after a CUDA error: stopping (rerun the rest with --problems)")
            break
    summary(results)
    return results


def summary(results: list[dict[str, Any]]) -> None:
    """Geomean speedup per variant over the problems that ran."""
    import math

    per: dict[str, list[float]] = {}
    for r in results:
        for v, row in r.get("variants", {}).items():
            if "speedup" in row:  # a variant that did not build has none
                per.setdefault(v, []).append(row["speedup"])
    for v, xs in per.items():
        say(f"[summary] {v}: geomean speedup {math.exp(sum(map(math.log, xs)) / len(xs)):.2f}x over {len(xs)} problems")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compile-only", action="store_true", help="nvcc each solution for sm_90a; no GPU")
    p.add_argument("--unit", action="store_true", help="test the GEMM core alone first")
    p.add_argument("--unit-only", action="store_true", help="the unit test and nothing else")
    p.add_argument("--problems", help="comma-separated prefixes (level1/17,level2/12); default: the manifest's")
    p.add_argument("--variants", help='compile-time switches, e.g. "STAGES=2;HI_IMPLICIT=1,FRESH_D=0"')
    p.add_argument("--skip-compile", action="store_true", help="no torch.compile baseline")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--jobs", type=int, default=8, help="parallel extension builds")
    p.add_argument("--kernelbench", help="KernelBench checkout (default: shared/kernelbench)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--out", help="or into this folder, as tc_fp32_check.json")
    args = p.parse_args(argv)
    variants = parse_variants(args.variants)
    result: dict[str, Any] = {"variants": [variant_name(v) for v in variants]}
    if args.compile_only:
        paths = [SOLUTIONS / e["solution"] for e in selected(args.problems)]
        result["compile"] = compile_only(paths, variants)
        failed = [r for r in result["compile"] if not r["ok"] or r["spill_bytes"]]
    else:
        failed = run_gpu(args, variants, result)
    write_json(args, result)
    return 1 if failed else 0


def run_gpu(args: argparse.Namespace, variants: list[dict[str, str]], result: dict[str, Any]) -> list[Any]:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU: use --compile-only here")
    if torch.cuda.get_device_capability() != (9, 0):
        raise SystemExit(f"wgmma needs an sm_90 GPU (H100/H200); this is {torch.cuda.get_device_name()}")
    os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0a"  # what the harness builds for an H100/H200 (wgmma needs the a)
    strict_fp32()
    result["device"] = torch.cuda.get_device_name()
    folder = Path(tempfile.mkdtemp(prefix="tc_fp32_check_"))
    failed: list[Any] = []
    if args.unit or args.unit_only:
        result["unit"] = run_unit(folder, variants, args.jobs)
        failed += [r for r in result["unit"] if not r.get("ok")]
    if not args.unit_only:
        result["problems"] = run_problems(args, variants, folder)
        failed += [r for r in result["problems"] if "error" in r]
    return failed


def write_json(args: argparse.Namespace, result: dict[str, Any]) -> None:
    path = Path(args.json) if args.json else (Path(args.out) / "tc_fp32_check.json" if args.out else None)
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1))
        say(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
