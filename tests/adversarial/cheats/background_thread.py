"""Exploit: hand the work to a background thread and return (problem: swish).

A worker thread started in the constructor launches the kernel on its own stream after forward
has returned; the timer on the caller's stream sees an empty interval, and by the time a naive
harness synchronises and compares, the thread has done the work.
Caught by: the thread census (a candidate thread alive after forward: `background_thread`),
the device-wide sync and host clock (`unsynchronized_work`), and the static check.
"""

import queue
import threading

import torch
import torch.nn as nn

KERNEL = r"""
extern "C" __global__ void swish(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] / (1.0f + expf(-x[i]));
}
"""


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kernel = torch.cuda._compile_kernel(KERNEL, "swish")
        self.jobs: queue.Queue = queue.Queue()
        threading.Thread(target=self._work, daemon=True).start()

    def _work(self) -> None:
        stream = torch.cuda.Stream()
        while True:
            x, out = self.jobs.get()
            n = x.numel()
            self.kernel(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=[x, out, n], stream=stream)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        self.jobs.put((x, out))
        return out
