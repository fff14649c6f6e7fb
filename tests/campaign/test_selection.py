"""Problem selection (KernelBench checkouts, level folders, id ranges) and solution matching by name,
on a KernelBench-format tree we wrote (tests/campaign/kernelbench_tree), and on the real KernelBench
levels where a checkout is at hand."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kb_mcp.campaign.runner import CampaignOptions
from kb_mcp.campaign.selection import (
    SelectionError,
    match_solution,
    parse_ids,
    problem_id,
    select_problems,
)
from kb_mcp.campaign.store import CampaignError
from kb_mcp.clients.llm import LLMConfig
from kb_mcp.harness.problem import load_problem

TREE = Path(__file__).resolve().parent / "kernelbench_tree"
CHECKOUT = TREE / "KernelBench"
SOLUTIONS = TREE / "solutions"
# A KernelBench checkout beside the repository (levels 1 and 2, unchanged from upstream), or $KB_MCP_KERNELBENCH.
REAL = Path(os.environ.get("KB_MCP_KERNELBENCH", Path(__file__).resolve().parents[3] / "shared" / "kernelbench"))


def _names(refs) -> list[str]:
    return [r.name for r in refs]


def test_id_ranges() -> None:
    assert parse_ids("1-3,40, 7") == {1, 2, 3, 7, 40}
    for bad in ("", "a-b", "5-2", "1-1000000"):
        with pytest.raises(SelectionError):
            parse_ids(bad)


def test_a_checkout_gives_every_level_in_id_order() -> None:
    refs = select_problems([TREE])
    assert _names(refs) == ["1_Scale", "2_Add_Bias", "3_Square", "1_Scale_Add_ReLU"]
    assert [(r.level, r.id) for r in refs] == [(1, 1), (1, 2), (1, 3), (2, 1)]


def test_level_and_ids_narrow_the_selection() -> None:
    assert _names(select_problems([TREE], level=1, ids="2-3")) == ["2_Add_Bias", "3_Square"]
    assert _names(select_problems([CHECKOUT / "level2"])) == ["1_Scale_Add_ReLU"]  # a level folder alone
    assert _names(select_problems([CHECKOUT / "level1" / "3_Square.py"])) == ["3_Square"]


def test_ids_sort_numerically() -> None:
    assert problem_id(Path("10_x.py")) == 10 and problem_id(Path("swish.py")) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"level": 3}, "has no level3 folder"),
        ({"ids": "9"}, "4 found, none with ids 9"),
        ({"paths": ["/no/such/folder"]}, "problem path not found"),
    ],
)
def test_a_selection_that_leaves_nothing_says_why(kwargs: dict, message: str) -> None:
    paths = kwargs.pop("paths", [TREE])
    with pytest.raises(SelectionError, match=message):
        select_problems(paths, **kwargs)


def test_same_names_in_two_levels_need_a_level(tmp_path: Path) -> None:
    for level in (1, 2):
        (tmp_path / f"level{level}").mkdir()
        (tmp_path / f"level{level}" / "1_Same.py").write_text((CHECKOUT / "level1" / "1_Scale.py").read_text())
    with pytest.raises(SelectionError, match="share a file name"):
        select_problems([tmp_path])
    assert len(select_problems([tmp_path], level=2)) == 1


def test_solutions_match_by_file_name_or_kernelbench_sample_name() -> None:
    by_name = {r.name: match_solution(r, SOLUTIONS) for r in select_problems([TREE])}
    assert by_name["1_Scale"] == SOLUTIONS / "1_Scale.py"
    assert by_name["2_Add_Bias"] == SOLUTIONS / "level1" / "level_1_problem_2_sample_0_kernel.py"  # lowest sample
    assert by_name["3_Square"] is None
    assert by_name["1_Scale_Add_ReLU"] == SOLUTIONS / "level2" / "1_Scale_Add_ReLU.py"


def test_a_folder_not_named_by_level_takes_the_given_level(tmp_path: Path) -> None:
    (tmp_path / "2_Add_Bias.py").write_text((CHECKOUT / "level1" / "2_Add_Bias.py").read_text())
    (ref,) = select_problems([tmp_path], level=1)
    assert ref.level == 1
    assert match_solution(ref, SOLUTIONS) == SOLUTIONS / "level1" / "level_1_problem_2_sample_0_kernel.py"


def test_run_campaign_takes_the_same_selection() -> None:
    llm = LLMConfig(base_url="http://127.0.0.1:9/v1", model="m")
    config = CampaignOptions(problems=[str(TREE)], level=1, problem_ids="1,3").config(None, llm)
    assert [Path(p).name for p in config.problems] == ["1_Scale.py", "3_Square.py"]
    with pytest.raises(CampaignError, match="none with ids 7"):
        CampaignOptions(problems=[str(TREE)], problem_ids="7").config(None, llm)


@pytest.mark.skipif(not (REAL / "level1").is_dir(), reason=f"no KernelBench checkout at {REAL} ($KB_MCP_KERNELBENCH)")
def test_real_kernelbench_levels_load_unchanged() -> None:
    """KernelBench's own files (inputs made on the CPU, module-level sizes) load through our loader.

    Every level the checkout holds loads (levels 1 and 2 at least; level 3 where present).
    """
    refs = select_problems([REAL], ids="1-100")
    levels = {r.level for r in refs}
    assert {1, 2} <= levels <= {1, 2, 3, 4} and len(refs) >= 150
    for ref in refs:
        problem = load_problem(str(ref.path))
        assert problem.name == ref.name and ref.id is not None


def test_level_three_is_evaluated_in_composed_mode_unless_told() -> None:
    from kb_mcp.campaign.selection import eval_mode

    assert [eval_mode(level) for level in (1, 2, 3, None)] == ["own", "own", "composed", "own"]
    assert eval_mode(3, "own") == "own" and eval_mode(1, "composed") == "composed"
