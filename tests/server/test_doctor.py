"""`kb-mcp doctor`: the real checks of this machine through the command line, each failure with a
fix and an exit status scripts can use; the parsers on recorded driver output."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kb_mcp.harness.gpu import lane
from kb_mcp.server.about import installed_version
from kb_mcp.server.doctor import (
    Machine,
    check_cluster,
    counters_restricted,
    parse_smi,
    torch_cuda_build,
)
from kb_mcp.server.doctor_model import Status

NAMES = ["kb-mcp", "settings", "GPU", "PyTorch", "nvcc", "ncu", "sandbox", "attempts", "GPU lane", "KB", "cache",
         "cluster"]

# nvidia-smi on an H100 machine (driver 580), as `--query-gpu=name,driver_version --format=csv,noheader`
# and the header of plain `nvidia-smi`
SMI_LISTING = "NVIDIA H100 80GB HBM3, 580.95.05\n"
SMI_HEADER = "| NVIDIA-SMI 580.95.05              Driver Version: 580.95.05      CUDA Version: 13.0     |\n"


def _doctor(args: list[str], kb: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(kb), "doctor", *args],
        capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
    )


def test_json_lists_every_check_and_the_exit_status_follows_them(tmp_path: Path) -> None:
    done = _doctor(["--json"], tmp_path / "kb.json")
    report = json.loads(done.stdout)
    assert [c["name"] for c in report["checks"]] == NAMES
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert done.returncode == (3 if failed else 0)  # a failed check is the machine's
    for check in report["checks"]:
        if check["status"] in ("warn", "fail"):
            assert check["fix"], check  # every problem comes with what to do
    kb = next(c for c in report["checks"] if c["name"] == "KB")
    assert kb["status"] == "ok" and "from --kb" in kb["summary"] and "created and seeded on first use" in kb["summary"]
    assert not (tmp_path / "kb.json").exists()  # the doctor looks, it does not create


def test_the_help_names_the_exit_status_a_failed_check_gives(tmp_path: Path) -> None:
    """A script reads `kb-mcp doctor --help` to gate on it: the status it names is the one a failure exits with."""
    failed = _doctor([], tmp_path / "kb.json", env={"KB_MCP_SESSIONS_PER_CLIENT": "0"})  # a setting it refuses
    assert failed.returncode not in (0, 1, 2), failed.stdout  # not a success, nor argparse's or the caller's
    said = " ".join(_doctor(["--help"], tmp_path / "kb.json").stdout.split())
    assert f"{failed.returncode} (the machine's to fix) when a check failed" in said


def test_a_kb_path_below_a_file_fails_saying_which_file(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.write_text("")
    done = _doctor(["--json"], home / "kb.json")
    kb = next(c for c in json.loads(done.stdout)["checks"] if c["name"] == "KB")
    assert done.returncode == 3 and kb["status"] == "fail"
    assert f"{home} is a file, not a folder" in kb["summary"] and "--kb" in kb["fix"]


BAD_SETTINGS = {  # each variable, a value its reader refuses, and words of that refusal
    "KB_MCP_LOCK_TIMEOUT": ("abc", "$KB_MCP_LOCK_TIMEOUT='abc' is not a number of seconds"),
    "KB_MCP_BACKUPS": ("-1", "$KB_MCP_BACKUPS='-1' is not a whole number"),
    "KB_MCP_MAX_TIMEOUT_S": ("x", "$KB_MCP_MAX_TIMEOUT_S='x' is not a number of seconds, more than 0"),
    "KB_MCP_ATTEMPTS": ("bogus", "$KB_MCP_ATTEMPTS='bogus' is not one of 'flag', 'invalid'"),
    "KB_MCP_PROFILE_STANDBY": ("maybe", "$KB_MCP_PROFILE_STANDBY='maybe' is not one of '1', 'true'"),
    "KB_MCP_WATCH": ("of", "$KB_MCP_WATCH='of' is not one of '1', 'true'"),
    "KB_MCP_LLM_TIMEOUT": ("0", "$KB_MCP_LLM_TIMEOUT='0' cannot be used"),
    "KB_MCP_SESSIONS_PER_CLIENT": ("0", "$KB_MCP_SESSIONS_PER_CLIENT='0' is not a whole number, more than 0"),
    "KB_MCP_JOBS_KEPT_PER_CLIENT": ("-2", "$KB_MCP_JOBS_KEPT_PER_CLIENT='-2' is not a whole number, more than 0"),
    "KB_MCP_CANDIDATES_KEPT_PER_CLIENT": ("x", "$KB_MCP_CANDIDATES_KEPT_PER_CLIENT='x' is not a whole number"),
    "KB_MCP_CAMPAIGNS_KEPT_PER_CLIENT": ("0", "$KB_MCP_CAMPAIGNS_KEPT_PER_CLIENT='0' is not a whole number, more than"),
    "KB_MCP_CAMPAIGN_MAX_PROBLEMS": ("0", "$KB_MCP_CAMPAIGN_MAX_PROBLEMS='0' is not a whole number, more than 0"),
}


def test_every_setting_the_server_would_refuse_fails_by_name_and_the_doctor_finishes(tmp_path: Path) -> None:
    done = _doctor(["--json"], tmp_path / "kb.json", env={k: v for k, (v, _) in BAD_SETTINGS.items()})
    report = json.loads(done.stdout)  # every check ran: a refused setting does not stop the doctor
    assert [c["name"] for c in report["checks"]] == NAMES and done.returncode == 3, done.stderr
    settings = next(c for c in report["checks"] if c["name"] == "settings")
    assert settings["status"] == "fail" and "unset it" in settings["fix"]
    for variable, (_, said) in BAD_SETTINGS.items():
        assert said in settings["summary"], variable


def test_an_ncu_set_to_nothing_runnable_is_named(tmp_path: Path) -> None:
    done = _doctor(["--json"], tmp_path / "kb.json", env={"KB_MCP_NCU": str(tmp_path / "ncu")})
    ncu = next(c for c in json.loads(done.stdout)["checks"] if c["name"] == "ncu")
    assert ncu["status"] in ("warn", "fail")
    assert f"$KB_MCP_NCU='{tmp_path / 'ncu'}' is not an executable" in ncu["summary"]
    assert "unset it" in ncu["fix"]


def test_a_damaged_kb_fails_with_a_fix_on_one_screen() -> None:
    # a short path, as a user's (a test runner's temporary folders are long enough to be elided on screen)
    with tempfile.TemporaryDirectory(prefix="kb") as short:
        _a_damaged_kb_fails_with_a_fix_on_one_screen(Path(short) / "kb.json")


def _a_damaged_kb_fails_with_a_fix_on_one_screen(kb: Path) -> None:
    kb.write_text('{"not": "a kb"')
    done = _doctor([], kb, env={"COLUMNS": "120"})
    assert done.returncode == 3
    lines = done.stdout.splitlines()
    assert len(lines) <= 40  # one screen
    row = next(i for i, line in enumerate(lines) if line.split()[1:2] == ["KB"])
    fix = next(i for i in range(row, len(lines)) if "fix:" in lines[i])
    assert "FAIL" in lines[row] and "cannot be opened" in " ".join(w.strip() for w in lines[row:fix])  # wrapped
    assert "kb repair" in " ".join(lines[fix:fix + 3])
    assert "check(s) failed: KB" in done.stdout
    assert kb.read_text() == '{"not": "a kb"'  # left as it was


def test_without_nvcc_the_fix_says_where_to_find_it_and_gpu_mode_fails(tmp_path: Path) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    env = {"PATH": str(bare), "KB_MCP_NCU": ""}
    report = json.loads(_doctor(["--json"], tmp_path / "kb.json", env).stdout)
    nvcc = next(c for c in report["checks"] if c["name"] == "nvcc")
    assert nvcc["status"] == "warn" and "PATH" in nvcc["fix"]
    strict = _doctor(["--json", "--gpu"], tmp_path / "kb.json", env)
    assert strict.returncode == 3
    statuses = {c["name"]: c["status"] for c in json.loads(strict.stdout)["checks"]}
    assert statuses["nvcc"] == "fail" and statuses["ncu"] == "fail"


def test_nvcc_on_path_is_found_with_its_release(tmp_path: Path) -> None:
    if shutil.which("nvcc") is None:
        import pytest

        pytest.skip("nvcc is not installed here")
    report = json.loads(_doctor(["--json"], tmp_path / "kb.json").stdout)
    nvcc = next(c for c in report["checks"] if c["name"] == "nvcc")
    assert nvcc["status"] in ("ok", "warn") and "CUDA " in nvcc["summary"]


def test_nvidia_smi_output_is_read() -> None:
    machine = parse_smi(SMI_LISTING, SMI_HEADER)
    assert machine.gpus == ["NVIDIA H100 80GB HBM3"] and machine.driver == "580.95.05" and machine.driver_cuda == "13.0"


def test_counter_permission_is_read_from_the_driver_params(tmp_path: Path) -> None:
    params = tmp_path / "params"
    params.write_text("ResmanDebugLevel: 4294967295\nRmProfilingAdminOnly: 1\n")
    assert counters_restricted(params) is True
    params.write_text("RmProfilingAdminOnly: 0\n")
    assert counters_restricted(params) is False
    assert counters_restricted(tmp_path / "missing") is None


def test_torch_build_is_read_without_importing_it() -> None:
    version, cuda = torch_cuda_build()
    import torch

    assert version == torch.__version__ and cuda == torch.version.cuda


def test_statuses_are_ordered_words() -> None:
    assert [s.value for s in Status] == ["ok", "info", "warn", "fail"]


def test_the_sandbox_check_is_the_harness_own(tmp_path: Path) -> None:
    def sandbox(setting: str) -> dict[str, str]:
        done = _doctor(["--json"], tmp_path / "kb.json", {"KB_MCP_SANDBOX": setting})
        return next(c for c in json.loads(done.stdout)["checks"] if c["name"] == "sandbox") | {
            "rc": str(done.returncode)
        }

    bogus = sandbox("bogus")
    assert bogus["status"] == "fail" and "not a sandbox setting" in bogus["summary"] and bogus["rc"] == "3"
    unconfined = sandbox("unconfined")
    assert unconfined["status"] == "warn" and "UNCONFINED" in unconfined["summary"]
    confined = sandbox("bwrap")  # this machine has bubblewrap (the sandbox tests need it)
    assert confined["status"] == "ok" and confined["summary"].startswith("bubblewrap (uid 65534")
    assert ("no process-count limit" in confined["summary"]) == (os.geteuid() == 0)


def test_the_attempts_check_makes_one_in_the_sandbox_or_says_why_it_cannot(tmp_path: Path) -> None:
    from kb_mcp.harness.sandbox.sandbox import detect

    def attempts(env: dict[str, str]) -> dict[str, str]:
        done = _doctor(["--json"], tmp_path / "kb.json", env)
        return next(c for c in json.loads(done.stdout)["checks"] if c["name"] == "attempts")

    here = attempts({})
    why = detect().watch_unavailable()
    if why:  # a machine without the watch: the line says why, with a fix
        assert here["status"] == "warn" and why in here["summary"] and here["fix"], here
    else:  # the test connection made in the sandbox was seen
        assert here["status"] == "ok" and "test connection" in here["summary"], here
    off = attempts({"KB_MCP_WATCH": "off"})
    assert off["status"] == "warn" and off["summary"] == "not recorded: KB_MCP_WATCH=off", off
    assert "unset KB_MCP_WATCH" in off["fix"]
    unconfined = attempts({"KB_MCP_SANDBOX": "unconfined"})
    assert unconfined["status"] == "warn" and "unconfined" in unconfined["summary"], unconfined
    assert "unset KB_MCP_SANDBOX" in unconfined["fix"]


def test_the_gpu_lane_check_names_its_key_and_who_holds_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lanes = {"KB_MCP_LANE_KEY": "doctor-test", "KB_MCP_LANE_DIR": str(tmp_path / "lanes")}
    for name, value in lanes.items():
        monkeypatch.setenv(name, value)
    with lane.hold("compile_and_verify"):
        report = json.loads(_doctor(["--json"], tmp_path / "kb.json", lanes).stdout)
    check = next(c for c in report["checks"] if c["name"] == "GPU lane")
    assert check["status"] == "ok"
    assert check["summary"].startswith("GPU doctor-test (explicit: named by KB_MCP_LANE_KEY)")
    assert "held now by compile_and_verify (`" in check["summary"] and f"pid {os.getpid()}," in check["summary"]
    no_gpu = {"KB_MCP_LANE_KEY": "", "CUDA_VISIBLE_DEVICES": "-1"}
    hidden = json.loads(_doctor(["--json"], tmp_path / "kb.json", no_gpu).stdout)
    check = next(c for c in hidden["checks"] if c["name"] == "GPU lane")
    assert check["status"] == "info" and check["summary"].startswith("no GPU visible")


def test_the_cluster_check_says_how_to_get_it_and_what_gpus_all_would_start(monkeypatch: pytest.MonkeyPatch) -> None:
    absent = check_cluster(Machine(), None)
    assert absent.status == Status.info and "run on one GPU" in absent.summary
    assert "pip install 'kernel-kb-mcp[cluster]' adds --gpus N" in absent.summary  # info: no fix line shown
    four = Machine(gpus=["NVIDIA H100 80GB HBM3"] * 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert "--gpus all starts 4 workers here, one per GPU (0, 1, 2, 3)" in check_cluster(four, "2026.8.0").summary
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # the user's own restriction holds
    assert "starts 2 workers here, one per GPU (2, 3)" in check_cluster(four, "2026.8.0").summary
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    one = check_cluster(Machine(gpus=["NVIDIA H100 80GB HBM3"]), "2026.8.0")
    assert one.status == Status.ok and "1 GPU here: --cluster ADDRESS spreads over hosts" in one.summary
    assert "Dask distributed 2026.8.0" in one.summary and "need this same version" in one.summary
    assert "--gpus N --compile-only runs N CPU workers" in check_cluster(Machine(), "2026.8.0").summary
    # read from the installed metadata, as the doctor's own line shows it (the tests' install has the extra)
    assert installed_version("distributed") is not None and installed_version("no-such-dist-kb-mcp") is None
