"""What `kb-mcp doctor` checks: each check looks at one thing this machine needs and, when it is
missing or wrong, says how to fix it.

Checks never import torch into this process (a CUDA build's import costs seconds and may itself
be what is broken): torch's version and CUDA build are read from its installed files, and torch is
only started, in a child process, where a GPU was found. Each check is a function returning a
`Check`; `run_checks` runs them in order and `Report.exit_code` turns the worst status into an
exit status for scripts.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from importlib import util
from pathlib import Path

from pydantic import BaseModel, Field

from kb_mcp.kb import paths
from kb_mcp.server.about import DIST_NAME, installed_version, package_version
from kb_mcp.server.doctor_model import Check, Report, Status
from kb_mcp.server.doctor_sandbox import check_attempts, check_sandbox

TORCH_RANGE = ">=2.6,<2.15"
PROFILING_PARAMS = Path("/proc/driver/nvidia/params")
MIN_FREE_BYTES = 2 * 1024**3  # builds and profiles of a few problems fit comfortably


class Machine(BaseModel):
    """What the checks found about the GPU side, shared between checks."""

    gpus: list[str] = Field(default_factory=list)
    driver: str | None = None
    driver_cuda: str | None = None  # the newest CUDA version the driver supports
    torch_cuda: str | None = None
    torch_sees_gpu: bool | None = None


def _run(cmd: list[str], timeout: float = 20.0) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _gpu_or_warn(require_gpu: bool) -> Status:
    return Status.fail if require_gpu else Status.warn


# -- the checks ------------------------------------------------------------------------------------


def check_install() -> Check:
    """This program, its Python and its platform."""
    version = package_version()
    where = f"Python {platform.python_version()} at {sys.executable}, {platform.system()} {platform.machine()}"
    if not version:
        return Check(
            name="kb-mcp", status=Status.warn, summary=f"running from a source tree that is not installed; {where}",
            fix=f"pip install . in the repository (the distribution is named {DIST_NAME})",
        )
    return Check(name="kb-mcp", status=Status.ok, summary=f"{DIST_NAME} {version}; {where}")


def parse_smi(listing: str, header: str) -> Machine:
    """GPU names and driver from `nvidia-smi --query-gpu=name,driver_version --format=csv,noheader`,
    and the driver's CUDA version from plain `nvidia-smi`'s header."""
    machine = Machine()
    for line in listing.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if parts and parts[0]:
            machine.gpus.append(parts[0])
            if len(parts) > 1 and parts[1]:
                machine.driver = parts[1]
    found = re.search(r"CUDA Version:\s*([0-9.]+)", header)
    machine.driver_cuda = found.group(1) if found else None
    return machine


def check_gpu(machine: Machine, require_gpu: bool) -> Check:
    """The GPUs and driver, as nvidia-smi reports them."""
    from kb_mcp.harness.gpu.gpu_probe import no_gpu_reason

    smi = shutil.which("nvidia-smi")
    reason = no_gpu_reason()
    if smi is not None and reason is None:
        listing = _run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"])
        header = _run([smi])
        if listing is not None and listing.returncode == 0:
            found = parse_smi(listing.stdout, header.stdout if header is not None else "")
            machine.gpus, machine.driver, machine.driver_cuda = found.gpus, found.driver, found.driver_cuda
        elif listing is not None:
            return Check(
                name="GPU", status=Status.fail,
                summary=f"nvidia-smi failed: {(listing.stderr or listing.stdout).strip()[:200]}",
                fix="the NVIDIA driver is not working: reinstall it or reboot after a driver update",
            )
    if machine.gpus:
        cuda = f", supports CUDA up to {machine.driver_cuda}" if machine.driver_cuda else ""
        return Check(name="GPU", status=Status.ok, summary=f"{', '.join(machine.gpus)} (driver {machine.driver}{cuda})")
    why = reason or "nvidia-smi is not installed"
    return Check(
        name="GPU", status=_gpu_or_warn(require_gpu), summary=f"none: {why}",
        fix="the KB tools work without one; to profile, verify and time kernels, run kb-mcp on a machine "
        "with an NVIDIA GPU and its driver (profile_kernel and compile_and_verify answer needs_gpu here)",
    )


def torch_cuda_build() -> tuple[str | None, str | None]:
    """(torch version, CUDA version it was built for or None for a CPU build), without importing it."""
    version = installed_version("torch")
    if version is None:
        return None, None
    spec = util.find_spec("torch")
    if spec is None or spec.origin is None:
        return version, None
    version_file = Path(spec.origin).with_name("version.py")
    try:
        text = version_file.read_text()
    except OSError:
        return version, None
    found = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([0-9.]+)['\"]", text, re.M)
    return version, found.group(1) if found else None


def check_torch(machine: Machine, require_gpu: bool) -> Check:
    """The installed PyTorch: in the supported range, a CUDA build where there is a GPU, able to see it."""
    version, cuda = torch_cuda_build()
    machine.torch_cuda = cuda
    if version is None:
        return Check(
            name="PyTorch", status=Status.fail, summary="not installed",
            fix=f"pip install 'torch{TORCH_RANGE}' (a CUDA build on GPU machines), then pip install . again",
        )
    build = f"CUDA {cuda} build" if cuda else "CPU build"
    summary = f"torch {version}, {build}"
    if not machine.gpus:
        status = _gpu_or_warn(require_gpu) if cuda is None and require_gpu else Status.ok
        return Check(name="PyTorch", status=status, summary=summary,
                     fix="install a CUDA build of torch on the GPU machine" if status != Status.ok else None)
    if cuda is None:
        return Check(
            name="PyTorch", status=Status.fail, summary=f"{summary} on a machine with a GPU",
            fix=f"install a CUDA build of torch ({TORCH_RANGE}) that your driver supports "
            f"(driver CUDA {machine.driver_cuda or '?'}), e.g. from the PyTorch index for your CUDA version",
        )
    if machine.driver_cuda and _major(cuda) > _major(machine.driver_cuda):
        return Check(
            name="PyTorch", status=Status.fail,
            summary=f"{summary}, but the driver supports CUDA only up to {machine.driver_cuda}",
            fix="update the NVIDIA driver, or install a torch build for the driver's CUDA version",
        )
    probe = _run([sys.executable, "-c", "import torch; print(torch.cuda.is_available(), torch.cuda.device_count())"],
                 120)
    seen = probe is not None and probe.returncode == 0 and probe.stdout.split()[:1] == ["True"]
    machine.torch_sees_gpu = seen
    if probe is None or not seen:
        err = (probe.stderr.strip().splitlines() or ["no output"])[-1][:200] if probe is not None else "timed out"
        return Check(
            name="PyTorch", status=Status.fail, summary=f"{summary}, but torch sees no GPU ({err})",
            fix="check CUDA_VISIBLE_DEVICES and that this user may open /dev/nvidia*; "
            "a driver older than the torch build also shows up here",
        )
    return Check(name="PyTorch", status=Status.ok, summary=f"{summary}, sees {probe.stdout.split()[1]} GPU(s)")


def _major(version: str) -> int:
    try:
        return int(version.split(".")[0])
    except ValueError:
        return 0


def check_nvcc(machine: Machine, require_gpu: bool) -> Check:
    """nvcc on PATH (load_inline candidates and compile-only checks use it)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return Check(
            name="nvcc", status=_gpu_or_warn(require_gpu), summary="not on PATH",
            fix="install the CUDA toolkit and put its bin/ on PATH (e.g. export PATH=/usr/local/cuda/bin:$PATH): "
            "load_inline candidates and the compile-only check need nvcc; NVRTC candidates need only torch",
        )
    out = _run([nvcc, "--version"])
    found = re.search(r"release ([0-9.]+)", out.stdout if out is not None else "")
    release = found.group(1) if found else "unknown version"
    if machine.torch_cuda and found and _major(release) != _major(machine.torch_cuda):
        return Check(
            name="nvcc", status=Status.warn,
            summary=f"{nvcc} (CUDA {release}) but torch was built for CUDA {machine.torch_cuda}",
            fix="load_inline refuses a different CUDA major version: put the matching toolkit's nvcc first on PATH",
        )
    return Check(name="nvcc", status=Status.ok, summary=f"{nvcc} (CUDA {release})")


def check_ncu(machine: Machine, require_gpu: bool) -> Check:
    """Nsight Compute, and whether this user may read the GPU's performance counters."""
    from kb_mcp.profiling.profiler import ENV_NCU, find_ncu

    ncu = find_ncu()
    given = os.environ.get(ENV_NCU, "").strip()
    if ncu is None and given:  # find_ncu looks nowhere else once it is set
        return Check(
            name="ncu", status=_gpu_or_warn(require_gpu), summary=f"${ENV_NCU}={given!r} is not an executable file",
            fix=f"set {ENV_NCU} to the path of an ncu this user can run, or unset it to look on PATH and in the "
            "usual CUDA folders",
        )
    if ncu is None:
        return Check(
            name="ncu", status=_gpu_or_warn(require_gpu), summary="Nsight Compute not found",
            fix=f"install Nsight Compute (part of the CUDA toolkit) or set {ENV_NCU} to its ncu; without it "
            "profile_kernel reports per-kernel timings only",
        )
    out = _run([ncu, "--version"])
    found = re.search(r"Version ([0-9.]+)", out.stdout if out is not None else "")
    summary = f"{ncu} ({found.group(1) if found else 'unknown version'})"
    restricted = counters_restricted()
    if restricted and os.geteuid() != 0:
        return Check(
            name="ncu", status=_gpu_or_warn(require_gpu),
            summary=f"{summary}; GPU counters are restricted to admin users (ERR_NVGPUCTRPERM)",
            fix="run kb-mcp as root, or let every user profile: echo 'options nvidia "
            "NVreg_RestrictProfilingToAdminUsers=0' | sudo tee /etc/modprobe.d/nvidia-profiling.conf, then reboot",
        )
    if restricted is None and machine.gpus:
        summary += "; counter permission unknown (no /proc/driver/nvidia/params)"
    elif machine.gpus:
        summary += "; counters readable"
    return Check(name="ncu", status=Status.ok, summary=summary)


def counters_restricted(params: Path = PROFILING_PARAMS) -> bool | None:
    """True when the driver restricts profiling to admins, None when it cannot be read."""
    try:
        text = params.read_text()
    except OSError:
        return None
    found = re.search(r"RmProfilingAdminOnly:\s*(\d+)", text)
    return bool(int(found.group(1))) if found else None


def check_lane() -> Check:
    """The GPU lane: the key this process's GPU takes turns under with every kb-mcp of the machine,
    whether the lane folder serves them all, and who holds it now (`harness.gpu.lane`)."""
    import socket

    from kb_mcp.harness.gpu.gpu_key import gpu_key
    from kb_mcp.harness.gpu.lane_file import LaneFile, LaneUnavailable, lane_dir

    key = gpu_key()
    if key is None:
        return Check(name="GPU lane", status=Status.info,
                     summary="no GPU visible: nothing is timed, and each process's lane is its own")
    try:
        folder = lane_dir()
    except LaneUnavailable as exc:
        return Check(name="GPU lane", status=Status.warn, summary=f"not machine-wide: {exc}",
                     fix="make the folder usable as the line says: meanwhile two kb-mcp processes may time on the "
                     "GPU at once, and no baseline is cached")
    holder = LaneFile(folder, key.key).holder()
    now = f"; held now by {holder.describe(socket.gethostname())}" if holder else "; free"
    summary = f"GPU {key.key} ({key.source}{': ' + key.note if key.note else ''}), lock files in {folder}{now}"
    if key.source == "fallback":
        return Check(name="GPU lane", status=Status.warn, summary=summary,
                     fix="make nvidia-smi runnable for every kb-mcp, so that each keys the GPU by its UUID")
    return Check(name="GPU lane", status=Status.ok, summary=summary)


def _kb_source(kb_arg: str | None) -> str:
    if kb_arg:
        return "--kb"
    if os.environ.get(paths.ENV_KB):
        return f"${paths.ENV_KB}"
    if os.environ.get(paths.ENV_HOME):
        return f"${paths.ENV_HOME}"
    return "default"


def check_kb(kb_arg: str | None) -> Check:
    """The KB file this command line would serve: where it comes from, that it opens, what is in it."""
    from kb_mcp.kb.errors import KbMcpError
    from kb_mcp.kb.files import path_error
    from kb_mcp.kb.store import KBStore

    path = paths.resolve_kb_path(kb_arg)
    where = f"{path} (from {_kb_source(kb_arg)})"
    unusable = path_error(path)
    if unusable is not None:  # a folder, or a file where one of its folders should be
        return Check(name="KB", status=Status.fail, summary=f"{where}: {unusable.message.removeprefix(f'{path}: ')}",
                     fix=unusable.action)
    if not path.exists():
        folder = next((p for p in path.parents if p.exists()), None)
        if folder is None or not os.access(folder, os.W_OK):
            return Check(name="KB", status=Status.fail, summary=f"{where} does not exist and cannot be created there",
                         fix="pass --kb PATH (or set KB_MCP_KB) to a file in a folder you can write")
        return Check(name="KB", status=Status.ok, summary=f"{where}: created and seeded on first use")
    if not os.access(path, os.R_OK | os.W_OK) or not os.access(path.parent, os.W_OK):
        return Check(name="KB", status=Status.fail, summary=f"{where}: not readable and writable by this user",
                     fix=f"fix the permissions of {path} and its folder (writes go through a temp file and a lock "
                         "beside it)")
    try:
        stats = KBStore.open(path).stats()
    except KbMcpError as exc:  # it says what to do with this KB as it is (kb.files words it), or a setting
        return Check(name="KB", status=Status.fail, summary=f"{where}: cannot be opened: {exc.message}",
                     fix=exc.action or f"`kb-mcp --kb {path} kb stats` says why")
    except (OSError, ValueError) as exc:
        return Check(name="KB", status=Status.fail, summary=f"{where}: cannot be opened: {exc}",
                     fix=f"check {path} and the file system it is on, then `kb-mcp --kb {path} kb stats`")
    return Check(
        name="KB", status=Status.ok,
        summary=f"{where}: {sum(stats.states.values())} states, {sum(stats.optimizations.values())} optimizations, "
        f"{sum(stats.outcomes.values())} outcomes, {stats.candidates} candidates",
    )


def _setting_readers() -> list[Callable[[], object]]:
    """Every reader of an operator's KB_MCP_ setting that refuses a value it cannot use: the doctor asks
    them, so it says what the server would refuse, in the same words (none of them is a second copy)."""
    from kb_mcp.campaign.caps import CampaignCaps
    from kb_mcp.campaign.owners import campaigns_kept_per_client
    from kb_mcp.clients.llm import LLMConfig
    from kb_mcp.harness.judgment.caps import Caps
    from kb_mcp.harness.sandbox import attempts, watch
    from kb_mcp.kb import backups, lock
    from kb_mcp.profiling.profile_standby import standby_enabled
    from kb_mcp.server.job_store import jobs_kept_per_client
    from kb_mcp.server.session_limit import sessions_per_client
    from kb_mcp.tools.candidate_store import candidates_kept_per_client

    return [lock.default_timeout, backups.default_keep, Caps.from_env, attempts.policy, watch.watch_enabled,
            standby_enabled, LLMConfig.from_env, sessions_per_client, jobs_kept_per_client,
            candidates_kept_per_client, campaigns_kept_per_client, CampaignCaps.from_env]


def refused_settings() -> list[str]:
    """What each reader says of a KB_MCP_ setting it refuses, in this environment ([] when none):
    the doctor reports them, and `kb-mcp serve` does not start while there is one."""
    from kb_mcp.kb.errors import KbMcpError

    refused = []
    for read in _setting_readers():
        try:
            read()
        except (KbMcpError, ValueError, RuntimeError) as exc:  # the readers' own refusals (LLM: RuntimeError)
            refused.append(str(exc).rstrip(". "))
    return refused


def check_settings() -> Check:
    """The KB_MCP_ variables set in this environment: each is read by the code that uses it."""
    refused = refused_settings()
    given = sorted(name for name in os.environ if name.startswith("KB_MCP_"))
    if refused:
        return Check(name="settings", status=Status.fail, summary="; ".join(refused),
                     fix="set each variable named to a value it takes, or unset it for its default: kb-mcp refuses "
                     "to start (or to run the tool that reads it) until then")
    return Check(name="settings", status=Status.ok,
                 summary=f"KB_MCP_ variables set: {', '.join(given)}" if given else "no KB_MCP_ variable set: "
                 "the defaults")


def check_cache() -> Check:
    """The build cache: writable, with room for builds."""
    cache = paths.cache_dir()
    folder = next((p for p in (cache, *cache.parents) if p.exists()), None)
    if folder is None or not os.access(folder, os.W_OK):
        return Check(name="cache", status=Status.fail, summary=f"{cache} cannot be written",
                     fix="set KB_MCP_CACHE to a folder you can write")
    free = shutil.disk_usage(folder).free
    if free < MIN_FREE_BYTES:
        return Check(name="cache", status=Status.warn, summary=f"{cache}: only {free / 1024**3:.1f} GB free",
                     fix="free disk space or set KB_MCP_CACHE to a larger disk: builds and profiles need a few GB")
    return Check(name="cache", status=Status.ok, summary=f"{cache} ({free / 1024**3:.0f} GB free)")


def check_cluster(machine: Machine, distributed: str | None) -> Check:
    """The optional cluster (`--gpus N`, `--cluster ADDRESS`, `kb-mcp worker`): whether Dask distributed
    (version `distributed`, None where absent) is installed, and the workers `--gpus all` would start."""
    from kb_mcp.campaign.cluster_models import visible_devices

    if distributed is None:
        return Check(name="cluster", status=Status.info,
                     summary=f"not installed: evals and campaigns run on one GPU (the default); pip install "
                     f"'{DIST_NAME}[cluster]' adds --gpus N, --cluster ADDRESS and kb-mcp worker")
    devices = visible_devices(len(machine.gpus))
    if len(devices) > 1:
        here = f"--gpus all starts {len(devices)} workers here, one per GPU ({', '.join(devices)})"
    elif devices:
        here = "1 GPU here: --cluster ADDRESS spreads over hosts (docs/cluster.md)"
    else:
        here = "no GPU here: --gpus N --compile-only runs N CPU workers, --cluster ADDRESS spreads over hosts"
    return Check(name="cluster", status=Status.ok,
                 summary=f"Dask distributed {distributed}; {here}; every host's workers need this same version")


def run_checks(kb_arg: str | None, *, require_gpu: bool = False, on_check: Callable[[Check],
                                                                                    None] | None = None) -> Report:
    """Runs every check in order (each GPU check reads what the earlier ones found)."""
    from kb_mcp.kb.errors import SettingError

    machine = Machine()
    steps: list[tuple[str, Callable[[], Check]]] = [
        ("kb-mcp", check_install),
        ("settings", check_settings),
        ("GPU", lambda: check_gpu(machine, require_gpu)),
        ("PyTorch", lambda: check_torch(machine, require_gpu)),
        ("nvcc", lambda: check_nvcc(machine, require_gpu)),
        ("ncu", lambda: check_ncu(machine, require_gpu)),
        ("sandbox", check_sandbox),
        ("attempts", check_attempts),
        ("GPU lane", check_lane),
        ("KB", lambda: check_kb(kb_arg)),
        ("cache", check_cache),
        ("cluster", lambda: check_cluster(machine, installed_version("distributed"))),
    ]
    checks = []
    for name, step in steps:
        try:
            check = step()
        except SettingError as exc:  # a setting the code this check runs refuses (also named under "settings")
            check = Check(name=name, status=Status.fail, summary=exc.message, fix=exc.action)
        checks.append(check)
        if on_check is not None:
            on_check(check)
    return Report(version=package_version(), require_gpu=require_gpu, checks=checks)
