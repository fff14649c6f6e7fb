"""The GPU lane's key (`harness.gpu.gpu_key`): the UUID of the GPU a process's harness measures on, as
`CUDA_VISIBLE_DEVICES` and nvidia-smi say; a fallback where nvidia-smi cannot say; an explicit key."""

from __future__ import annotations

import pytest

from kb_mcp.harness.gpu.gpu_key import ENV_LANE_KEY, GpuKey, gpu_key, parse_smi, resolve_key, safe_key

# What `nvidia-smi --query-gpu=index,uuid,name --format=csv,noheader` prints on a two-GPU machine.
SMI = """0, GPU-8f3c2a10-1111-2222-3333-444455556666, NVIDIA H100 80GB HBM3
1, GPU-0b7d9e21-aaaa-bbbb-cccc-ddddeeeeffff, NVIDIA H100 80GB HBM3
"""
GPUS = parse_smi(SMI)
FIRST, SECOND = GPUS[0].uuid, GPUS[1].uuid


def test_nvidia_smi_output_is_read() -> None:
    assert [(g.index, g.uuid, g.name) for g in GPUS] == [
        (0, "GPU-8f3c2a10-1111-2222-3333-444455556666", "NVIDIA H100 80GB HBM3"),
        (1, "GPU-0b7d9e21-aaaa-bbbb-cccc-ddddeeeeffff", "NVIDIA H100 80GB HBM3"),
    ]
    assert parse_smi("No devices were found\n") == []


@pytest.mark.parametrize(("visible", "uuid"), [
    (None, FIRST),  # unset: CUDA's device 0
    ("0", FIRST),
    ("1", SECOND),
    ("1,0", SECOND),  # the harness uses the first visible GPU
    (" 1 , 0", SECOND),
    (SECOND, SECOND),
    ("GPU-0b7d", SECOND),  # a unique prefix, as CUDA accepts it
    (f"{FIRST},{SECOND}", FIRST),
])
def test_the_key_is_the_uuid_of_the_first_visible_gpu(visible: str | None, uuid: str) -> None:
    assert resolve_key(visible, GPUS) == GpuKey(key=uuid, source="uuid")


def test_two_spellings_of_one_gpu_give_one_key() -> None:
    assert resolve_key("1", GPUS).key == resolve_key(SECOND, GPUS).key == resolve_key("GPU-0b7d9e", GPUS).key


def test_a_mig_instance_is_its_own_key() -> None:
    mig = "MIG-5c1a3e0f-9b7d-5f2e-8a6c-0d4b2f1e3c5a"
    assert resolve_key(mig, GPUS) == GpuKey(key=mig, source="mig")
    assert resolve_key(mig, None).source == "mig"


@pytest.mark.parametrize(("visible", "key"), [(None, "index-0"), ("2", "index-2"), ("2,0", "index-2"),
                                              (SECOND, SECOND)])
def test_without_nvidia_smi_the_key_falls_back_to_what_the_variable_names(visible: str | None, key: str) -> None:
    found = resolve_key(visible, None)
    assert (found.key, found.source) == (key, "fallback") and "nvidia-smi" in found.note


def test_a_gpu_nvidia_smi_does_not_list_falls_back_and_says_why() -> None:
    assert resolve_key("7", GPUS) == GpuKey(key="index-7", source="fallback", note="nvidia-smi lists no GPU of index 7")
    ambiguous = resolve_key("GPU-", GPUS)
    assert ambiguous.source == "fallback" and "2 of the GPUs" in ambiguous.note


def test_an_explicit_key_is_taken_as_named_and_made_safe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_LANE_KEY, "ci lane/../1")
    assert gpu_key() == GpuKey(key="ci-lane-..-1", source="explicit", note=f"named by {ENV_LANE_KEY}")
    assert "/" not in safe_key("../../etc/passwd") and safe_key("///") == "gpu"


def test_no_key_where_no_gpu_is_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_LANE_KEY, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert gpu_key() is None
