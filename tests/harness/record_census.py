"""Records real kernel censuses on a GPU for the CPU tests (tests/harness/data/census_<gpu>.json).

    python tests/harness/record_census.py OUT_DIR

Each case runs one call under `integrity_runtime.profile_events` and stores the raw profiler events
with what the case is known to be: own kernels only, PyTorch ops only, or both. The CPU test
`test_recorded_gpu_census` then parses (`launches_from_events`) and sorts (`classify_launches`) the
recorded events and checks the outcome.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from kb_mcp.harness.worker.integrity_runtime import classify_launches, launches_from_events, profile_events

OWN = r"""
extern "C" __global__ void twice(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
"""


def main(out_dir: Path) -> None:
    dev = "cuda"
    x = torch.randn(1 << 16, device=dev)
    a = torch.randn(512, 512, device=dev)
    img = torch.randn(8, 16, 32, 32, device=dev)
    conv_w = torch.randn(32, 16, 3, 3, device=dev)
    kernel = torch.cuda._compile_kernel(OWN, "twice")

    def own() -> torch.Tensor:
        y = torch.empty_like(x)
        kernel(grid=((x.numel() + 255) // 256, 1, 1), block=(256, 1, 1), args=[x, y, x.numel()])
        return y

    def own_with_zeros() -> torch.Tensor:
        y = torch.zeros_like(x)  # a fill kernel under an allowed op
        kernel(grid=((x.numel() + 255) // 256, 1, 1), block=(256, 1, 1), args=[x, y, x.numel()])
        return y

    cases = [
        ("nvrtc_own_kernel", own, True, False, []),
        ("own_kernel_and_zeros", own_with_zeros, True, False, []),
        ("torch_softmax", lambda: torch.softmax(x, 0), False, True, []),
        ("torch_linear_cublas", lambda: F.linear(a, a), False, True, []),
        ("torch_linear_allowed", lambda: F.linear(a, a), False, False, ["gemm"]),
        ("torch_conv_cudnn", lambda: F.conv2d(img, conv_w, padding=1), False, True, []),
        ("own_plus_torch", lambda: own() + torch.tanh(x), True, True, []),
    ]
    from kb_mcp.harness.worker.integrity_runtime import expand_runtime_allow

    recorded = []
    for name, fn, expect_own, expect_library, allow in cases:
        fn()  # warm: first-call library set-up is not what a census sees in the harness
        torch.cuda.synchronize()
        events = profile_events(fn)
        assert any(e.device == "cuda" for e in events), "the profiler saw no GPU activity"
        allow_set = sorted(expand_runtime_allow(allow))
        census = classify_launches(launches_from_events(events), allow_set)
        print(name, "own", census.own, "library", census.library, "torch", census.torch_ops)
        recorded.append(
            {
                "name": name,
                "events": [e.model_dump() for e in events],
                "expect_own": expect_own,
                "expect_library": expect_library,
                "allow": allow_set,
            }
        )
    gpu = torch.cuda.get_device_name().replace(" ", "_").lower()
    data = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": recorded}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"census_{gpu.split('_')[1] if '_' in gpu else gpu}.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "data")
