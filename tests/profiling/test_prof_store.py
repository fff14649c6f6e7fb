"""The profile store (`kb_mcp.profiling.profile_store`) on real files: damaged stored profiles are the
environment's to fix, listing survives files that vanish, and writes leave nothing half-done behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from prof_fixtures import own_profile

from kb_mcp.kb.errors import EnvironmentFault, StorageError
from kb_mcp.profiling.profile_store import ProfileNotFound, ProfileStore, new_profile_id
from kb_mcp.tools import classify_state
from kb_mcp.tools.context import ToolContext


def _saved(store: ProfileStore) -> str:
    profile = own_profile("stream")
    profile.profile_id = new_profile_id()
    store.save(profile)
    return profile.profile_id


def _cut(text: bytes) -> bytes:
    return text[: len(text) // 2]


@pytest.mark.parametrize("damage", [
    pytest.param(_cut, id="cut-json"),
    pytest.param(lambda _: b"not json at all", id="not-json"),
    pytest.param(lambda _: b'{"kernels": "none"}', id="wrong-shape"),
    pytest.param(lambda _: b"[1, 2, 3]", id="a-list"),
    pytest.param(lambda _: b"\xff\xfe\x00", id="not-utf8"),
    pytest.param(lambda _: b"", id="empty"),
])
def test_a_damaged_stored_profile_is_the_environments_fault_naming_the_file(tmp_path: Path, damage) -> None:
    store = ProfileStore(tmp_path / "profiles")
    profile_id = _saved(store)
    path = store.path(profile_id)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(EnvironmentFault) as caught:
        store.load(profile_id)
    assert caught.value.whose == "environment"
    assert caught.value.where == str(path)
    assert str(path) in caught.value.message and "damaged" in caught.value.message
    assert caught.value.action and f"mv {path}" in caught.value.action


def test_a_moved_aside_damaged_profile_is_no_longer_listed(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path / "profiles")
    profile_id = _saved(store)
    path = store.path(profile_id)
    path.write_text("{")
    with pytest.raises(EnvironmentFault) as caught:
        store.load(profile_id)
    assert caught.value.action is not None
    aside = caught.value.action.split("`mv ", 1)[1].split("`", 1)[0].split(" ")[1]
    path.rename(aside)  # what the action says to do
    assert store.ids() == []
    with pytest.raises(ProfileNotFound, match="run profile_kernel first"):
        store.load(profile_id)


def test_classify_state_on_a_damaged_profile_blames_the_environment_not_the_caller(kb_path: Path) -> None:
    ctx = ToolContext(kb_path)
    store = ProfileStore(ctx.profiles_dir)
    profile_id = _saved(store)
    store.path(profile_id).write_text('{"profile_id": 7}')
    with pytest.raises(EnvironmentFault, match="is damaged"):
        classify_state.run(ctx, classify_state.Request(profile_id=profile_id))


def test_a_stored_profile_that_cannot_be_read_is_a_storage_error(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path / "profiles")
    _saved(store)
    looped = store.path(new_profile_id())
    looped.symlink_to(looped.name)  # a link to itself: opening it fails (ELOOP) for every account, root too
    with pytest.raises(StorageError, match="cannot read the stored profile") as caught:
        store.load(looped.stem)
    assert caught.value.where == str(looped)


def test_ids_leave_out_a_file_that_is_gone_when_it_is_looked_at(tmp_path: Path) -> None:
    """A name the folder lists whose file is gone by the time its date is read (here a link to a
    removed file, which stays listed, as a file deleted mid-listing is for a moment)."""
    store = ProfileStore(tmp_path / "profiles")
    kept = _saved(store)
    gone = new_profile_id()
    store.path(gone).symlink_to(tmp_path / "removed.json")
    assert store.ids() == [kept]


def test_save_where_the_folder_cannot_be_made_is_a_storage_error(tmp_path: Path) -> None:
    root = tmp_path / "profiles"
    root.write_text("a file where the profiles folder should be")
    with pytest.raises(StorageError, match="cannot store the profile") as caught:
        _saved(ProfileStore(root))
    assert caught.value.whose == "environment"


def test_save_leaves_only_the_profile_behind(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path / "profiles")
    profile_id = _saved(store)
    assert sorted(p.name for p in store.root.iterdir()) == [f"{profile_id}.json"]
