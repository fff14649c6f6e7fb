"""Exploit: pin the input in L2 so the harness's cache flush cannot evict it (problem: row_sum).

Through the CUDA driver, the candidate reserves a quarter of L2 as persisting set-aside and puts
an access-policy window over (the start of) its input on the current stream: accesses to the window persist in
L2, and the flush kernel (ordinary, streaming accesses) cannot evict them, so later timed runs
read their input from L2, not DRAM.
Caught by: reading the persisting limit and the stream's window through the driver after the
candidate ran (`l2_persistence`), and the static check.
"""

import ctypes

import torch
import torch.nn as nn

KERNEL = r"""
extern "C" __global__ void row_sum(const float* x, float* out, int cols) {
    __shared__ float partial[256];
    const float* row = x + (size_t)blockIdx.x * cols;
    float acc = 0.0f;
    for (int c = threadIdx.x; c < cols; c += 256) acc += row[c];
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int s = 128; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}
"""


class _Window(ctypes.Structure):
    # CUaccessPolicyWindow inside the 64-byte CUstreamAttrValue union
    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t), ("hit_ratio", ctypes.c_float),
                ("hit_prop", ctypes.c_int), ("miss_prop", ctypes.c_int), ("pad", ctypes.c_ubyte * 36)]


_driver = ctypes.CDLL("libcuda.so.1")


def _persist(t: torch.Tensor) -> None:
    limit = torch.cuda.get_device_properties(t.device).L2_cache_size // 4  # below the device's maximum
    _driver.cuCtxSetLimit(ctypes.c_int(0x06), ctypes.c_size_t(limit))  # CU_LIMIT_PERSISTING_L2_CACHE_SIZE
    window = _Window(t.data_ptr(), min(t.numel() * t.element_size(), limit), 1.0, 2, 1)  # persisting / streaming
    stream = ctypes.c_void_p(torch.cuda.current_stream(t.device).cuda_stream)
    _driver.cuStreamSetAttribute(stream, ctypes.c_int(1), ctypes.byref(window))  # ACCESS_POLICY_WINDOW


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kernel = torch.cuda._compile_kernel(KERNEL, "row_sum")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _persist(x)
        out = torch.empty(x.shape[0], 1, device=x.device, dtype=x.dtype)
        self.kernel(grid=(x.shape[0], 1, 1), block=(256, 1, 1), args=[x, out, x.shape[1]])
        return out
