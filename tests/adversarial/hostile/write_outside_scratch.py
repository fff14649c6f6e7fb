"""Attack: write outside its scratch folder: into the shared build cache (replacing another
candidate's published extension, or planting one under a name a later candidate will load), into
the server's working folder, the Python installation and /tmp.

Stopped by: read-only binds and a private /tmp. The published builds and the code are mounted
read-only, the server's working folder is not mounted, and /tmp is a fresh tmpfs that disappears
with the sandbox. Builds are published by the server only, from a build process that runs no
candidate code.
"""

import os
import site

import torch
import torch.nn as nn

T = __TARGETS__


def attack() -> None:
    targets = [T["published"], os.path.join(os.path.dirname(T["published"]), "planted.so"),
               os.path.join(T["cache"], "torch_extensions", "poison_0123456789abcdef", "poison_0123456789abcdef.so"),
               os.path.join(T["cache"], "baselines", "planted.json"),
               os.path.join(T["cwd"], "planted.txt"), os.path.join(site.getsitepackages()[0], "planted.pth"),
               os.path.join(os.path.dirname(torch.__file__), "planted.py"), "/tmp/kbmcp-hostile-planted"]
    for path in targets:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(b"planted")
        except OSError:
            pass


attack()


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        attack()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attack()
        return x * torch.sigmoid(x)
