"""The pristine copies an input set's inputs are checked against, on the device or on the host
(worker side, torch), as the memory plan says (`harness.gpu.memory.MemoryPlan.pristine`).

* **device**: the set itself is the pristine copy and the candidate gets a clone; whether its
  inputs are unchanged is one comparison on the device, a chunk at a time (`values.same`), and the
  float64 judgment finds its inputs there.
* **host**: the set is copied into host memory before the reference runs, and the candidate gets
  the set itself (one set fewer on the device). The host memory is one buffer per input position,
  pinned where CUDA is present (a copy there runs at the bus's speed, where pageable memory is
  first faulted in page by page), made once and reused set after set: only one set is checked at
  a time, and the copies of the last are not needed once the next is kept. A comparison uploads
  it a chunk at a time.

The same code runs on CPU tensors (the "device" is then the CPU): the CPU tests exercise it.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from kb_mcp.harness.worker.values import same

__all__ = ["Pristine"]


class Pristine:
    """Keeps, checks and puts back the pristine copies of one input set at a time."""

    def __init__(self, where: Literal["device", "host"]) -> None:
        self.where = where
        self._buffers: dict[int, torch.Tensor] = {}  # host memory per input position, reused (bytes)
        self.host_bytes = 0  # host memory the buffers hold

    @property
    def on_host(self) -> bool:
        """Whether the pristine copies are kept in host memory."""
        return self.where == "host"

    def keep(self, xs: list[Any]) -> list[Any]:
        """The copy of `xs` the candidate's inputs are checked against: `xs` itself (device), or a
        copy in host memory taken now (host). A host copy is valid until the next `keep`."""
        if not self.on_host:
            return xs
        return [self._to_host(i, x) if isinstance(x, torch.Tensor) else x for i, x in enumerate(xs)]

    def changed(self, xs: list[Any], pristine: list[Any]) -> list[int]:
        """The positions of the tensors of `xs` that differ from their pristine copies."""
        return [i for i, (x, p) in enumerate(zip(xs, pristine))
                if isinstance(x, torch.Tensor) and isinstance(p, torch.Tensor) and not same(x, p)]

    def restore(self, xs: list[Any], pristine: list[Any], positions: list[int]) -> None:
        """Puts the pristine values back into `xs` at `positions` (the reference wrote into them)."""
        for i in positions:
            xs[i].copy_(pristine[i])

    def _to_host(self, position: int, x: torch.Tensor) -> torch.Tensor:
        """`x`'s values in the host buffer of `position` (grown where the set's tensor is larger),
        viewed in `x`'s shape and dtype, contiguous."""
        x = x.detach()
        size = x.numel() * x.element_size()
        buf = self._buffers.get(position)
        if buf is None or buf.numel() < size:
            self._buffers.pop(position, None)
            buf = self._new_buffer(size, pinned=x.is_cuda)
            self._buffers[position] = buf
            self.host_bytes = sum(b.numel() for b in self._buffers.values())
        copy = buf[:size].view(x.dtype).view(x.shape) if size else torch.empty(x.shape, dtype=x.dtype)
        copy.copy_(x if x.is_contiguous() else x.contiguous())  # synchronous: the reference runs on x next
        return copy

    @staticmethod
    def _new_buffer(size: int, pinned: bool) -> torch.Tensor:
        """Host memory of `size` bytes, pinned where it can be (else pageable: slower, as large)."""
        if pinned:
            try:
                return torch.empty(size, dtype=torch.uint8, pin_memory=True)
            except RuntimeError:  # page-locked memory refused (limits of the host): pageable instead
                pass
        return torch.empty(size, dtype=torch.uint8)
