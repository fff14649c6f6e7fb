"""Fixtures of the hostile suite: a server's world (hostile_world.py) and the sandbox its server uses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hostile_world import SECRETS, ServerWorld

from kb_mcp.harness.sandbox.sandbox import Sandbox, detect


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerWorld]:
    """A server's world; the environment carries its secrets while the module's tests run."""
    with pytest.MonkeyPatch.context() as mp:
        root = tmp_path_factory.mktemp("hostile")
        w = ServerWorld(root)
        for name, value in SECRETS.items():
            mp.setenv(name, value)
        mp.setenv("HOME", str(w.home))
        mp.setenv("KB_MCP_HOME", str(w.kb_dir))
        try:
            yield w
        finally:
            w.listener.close()


@pytest.fixture(scope="module")
def world_sandbox(world: ServerWorld) -> Sandbox:
    """The sandbox a server for this world would use (its KB, artifacts and home among what it hides:
    the home is named, since a sandbox detected earlier in the run took its home from the HOME then)."""
    return detect().with_private([world.kb_dir, world.artifacts, world.home])


