"""profile_kernel on a user's own Nsight Compute report: CSV exports (raw page, details page, both;
base units or auto-scaled) become a stored profile that classify_state reads like one of ours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prof_fixtures import OWN, PROBLEMS, SHARED
from pydantic import ValidationError

from kb_mcp.profiling.profile_store import ProfileStore
from kb_mcp.tools import classify_state, profile_kernel
from kb_mcp.tools.base import ToolError
from kb_mcp.tools.context import ToolContext


@pytest.fixture
def ctx(kb_path: Path):
    context = ToolContext(kb_path)
    yield context
    context.close()


def _import(ctx: ToolContext, *paths: Path, **kw: object) -> profile_kernel.Result:
    return profile_kernel.run(ctx, profile_kernel.Request(report=[str(p) for p in paths], **kw))


def test_raw_and_details_pages_become_a_classifiable_profile(ctx: ToolContext) -> None:
    result = _import(ctx, OWN / "bank_conflicts.raw.csv", OWN / "bank_conflicts.details.csv")
    assert result.kernel_count == 1 and result.arch == "sm_90" and result.method == "ncu"
    (k,) = result.kernels
    assert k.name == "conflicted_reads" and k.memory_throughput_pct == pytest.approx(99.89)
    assert any(f.rule == "SharedMemoryConflicts" for f in k.findings)
    stored = ProfileStore(ctx.profiles_dir).load(result.profile_id)
    assert stored.imported_from == [str((OWN / n).resolve()) for n in ("bank_conflicts.raw.csv",
                                                                       "bank_conflicts.details.csv")]
    assert stored.total_gpu_time_ns == pytest.approx(2616256.0)
    assert any("imported from" in n for n in stored.notes)
    state = classify_state.run(ctx, classify_state.Request(profile_id=result.profile_id))
    assert state.overall is not None and state.overall.state_id == "memory_bank_conflicts"


def test_a_stored_profile_is_redacted_of_secret_values(ctx: ToolContext, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A report is the user's text: a secret value in it (here, in a kernel name) reaches neither
    the stored profile nor the result."""
    secret = "kbmcp-secret-0123456789"
    monkeypatch.setenv("KBMCP_TEST_API_KEY", secret)
    pages = []
    for name in ("bank_conflicts.raw.csv", "bank_conflicts.details.csv"):
        page = tmp_path / name
        page.write_text((OWN / name).read_text().replace("conflicted_reads", f"conflicted_reads_{secret}"))
        pages.append(page)
    result = _import(ctx, *pages, detail=True)
    stored = ProfileStore(ctx.profiles_dir).path(result.profile_id)
    assert "[redacted $KBMCP_TEST_API_KEY]" in stored.read_text()
    assert secret not in stored.read_text() and secret not in result.model_dump_json()


def test_a_details_page_alone_with_auto_scaled_units(ctx: ToolContext) -> None:
    """The default `ncu --import R --csv` export: section metrics by label, 'us' and '463,996'."""
    result = _import(ctx, SHARED / "ncu_stream.details-page.csv")
    (k,) = result.kernels
    assert k.duration_us == pytest.approx(291.84) and k.dram_throughput_pct == pytest.approx(81.29)
    assert result.counters_available and result.total_elapsed_cycles == 463996.0
    state = classify_state.run(ctx, classify_state.Request(profile_id=result.profile_id))
    assert state.overall is not None and state.overall.state_id == "memory_bandwidth_saturated"


def test_a_raw_page_alone_says_the_findings_are_missing(ctx: ToolContext) -> None:
    result = _import(ctx, OWN / "tiny_launches.raw.csv", problem=str(PROBLEMS / "relu_mul_add.py"))
    assert result.kernel_count == 24 and result.problem == "relu_mul_add"
    assert any("rule findings are missing" in n for n in result.notes)
    state = classify_state.run(ctx, classify_state.Request(profile_id=result.profile_id))
    assert state.overall is not None and state.overall.state_id == "api_overhead_dominant"


def test_pages_are_recognised_whatever_their_order(ctx: ToolContext) -> None:
    a = _import(ctx, OWN / "strided.details.csv", OWN / "strided.raw.csv")
    b = _import(ctx, OWN / "strided.raw.csv", OWN / "strided.details.csv")
    assert a.kernels == b.kernels and a.profile_id != b.profile_id


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (["missing.csv"], "report file not found"),
        (["notes.csv"], "expected `ncu --csv --page raw` or `--page details` output"),
        (["a.raw.csv", "b.raw.csv"], "a second raw page"),
        (["r.ncu-rep", "a.raw.csv"], "pass a .ncu-rep file alone"),
    ],
)
def test_unusable_files_are_the_callers_to_fix(ctx: ToolContext, tmp_path: Path, files: list[str],
                                               message: str) -> None:
    (tmp_path / "notes.csv").write_text("name,value\nx,1\n")
    for name in ("a.raw.csv", "b.raw.csv"):
        (tmp_path / name).write_text((OWN / "stream.raw.csv").read_text())
    (tmp_path / "r.ncu-rep").write_bytes(b"\x00not a report")
    with pytest.raises(ToolError, match=message):
        _import(ctx, *(tmp_path / f for f in files))


def test_an_ncu_rep_without_nsight_compute_says_how_to_export(ctx: ToolContext, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KB_MCP_NCU", "")  # this machine: no ncu, and no ncu_report module
    report = tmp_path / "mine.ncu-rep"
    report.write_bytes(b"\x00")
    with pytest.raises(ToolError) as info:
        _import(ctx, report)
    text = str(info.value)
    assert "neither Nsight Compute's ncu_report module nor ncu" in text
    assert "ncu --import mine.ncu-rep --page raw --csv --print-units base > mine.raw.csv" in text
    assert not ctx.profiles_dir.exists() or not list(ctx.profiles_dir.glob("p_*.json"))  # nothing stored


def test_request_needs_a_problem_or_a_report() -> None:
    with pytest.raises(ValidationError, match="give problem"):
        profile_kernel.Request()
    with pytest.raises(ValidationError, match="exclude each other"):
        profile_kernel.Request(report="r.ncu-rep", candidate="c.py")
    assert profile_kernel.Request(report="r.ncu-rep").report == ["r.ncu-rep"]  # one path as a plain string


# A stand-in for NVIDIA's `ncu_report` (not installable here; the GPU test reads a real report with the
# real module), implementing the part of its documented interface the reader uses, over a real
# recording's values. It exercises the sandboxed reader process and its JSON protocol.
STAND_IN = '''
import json


class IAction:
    NameBase_DEMANGLED = 1


class _Metric:
    def __init__(self, value):
        self._value = value

    def has_value(self):
        return self._value is not None

    def value(self):
        return self._value


class _Action:
    def __init__(self, data):
        self._data = data

    def name(self, base=None):
        return self._data["name"]

    def metric_names(self):
        return list(self._data["metrics"])

    def metric_by_name(self, name):
        return _Metric(self._data["metrics"].get(name))


class _Range:
    def __init__(self, actions):
        self._actions = actions

    def num_actions(self):
        return len(self._actions)

    def action_by_idx(self, i):
        return _Action(self._actions[i])


class _Context:
    def __init__(self, ranges):
        self._ranges = ranges

    def num_ranges(self):
        return len(self._ranges)

    def range_by_idx(self, i):
        return _Range(self._ranges[i])


def load_report(path):
    with open(path) as fh:
        return _Context(json.load(fh)["ranges"])
'''


def test_an_ncu_rep_is_read_by_the_report_module_in_the_sandbox(ctx: ToolContext, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from kb_mcp.profiling.ncu_parse import read_raw_page

    (rec,) = read_raw_page((OWN / "bank_conflicts.raw.csv").read_text())
    metrics: dict[str, object] = dict(rec.metrics)
    metrics.update({"launch__grid_dim_x": 1056, "launch__block_dim_x": 256, "device__attribute_display_name": "H100",
                    "device__attribute_compute_capability_major": 9, "device__attribute_compute_capability_minor": 0})
    module_dir = tmp_path / "extras"
    module_dir.mkdir()
    (module_dir / "ncu_report.py").write_text(STAND_IN)
    report = tmp_path / "mine.ncu-rep"
    report.write_text(json.dumps({"ranges": [[{"name": rec.full_name, "metrics": metrics}]]}))
    monkeypatch.syspath_prepend(str(module_dir))
    monkeypatch.setenv("KB_MCP_NCU", "")  # no ncu CLI: metrics from the module alone
    result = _import(ctx, report)
    (k,) = result.kernels
    assert k.name == "conflicted_reads" and k.grid == (1056, 1,
                                                       1) and result.arch == "sm_90" and result.device == "H100"
    assert any("rule findings (details page) are missing" in n for n in result.notes)
    state = classify_state.run(ctx, classify_state.Request(profile_id=result.profile_id))
    assert state.overall is not None and state.overall.state_id == "memory_bank_conflicts"


def test_a_report_the_module_cannot_read_is_refused_with_the_export_hint(ctx: ToolContext, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    module_dir = tmp_path / "extras"
    module_dir.mkdir()
    (module_dir / "ncu_report.py").write_text(STAND_IN)
    report = tmp_path / "broken.ncu-rep"
    report.write_bytes(b"\x00\x01 not json")
    monkeypatch.syspath_prepend(str(module_dir))
    monkeypatch.setenv("KB_MCP_NCU", "")
    with pytest.raises(ToolError, match="ncu_report could not read it and there is no ncu.*--print-units base"):
        _import(ctx, report)
