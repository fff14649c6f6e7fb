"""The timed runs' re-check on CUDA tensors (`values.compare(detail=False)`): the lean arithmetic for a
finite reference decides as the general one and as the same tensors on the host, over several chunks
of the real chunk size, for outputs right, off by a few tolerances, and NaN, Inf or overflowing."""

from __future__ import annotations

import pytest
import torch

from kb_mcp.harness.judgment.verdict import VerifyOptions
from kb_mcp.harness.worker import values

pytestmark = pytest.mark.gpu

N = 3 * values.CHUNK_ELEMENTS + 12345  # four chunks, the last one short


def _outputs(r: torch.Tensor, scale: float, atol: float, rtol: float) -> dict[str, torch.Tensor]:
    tol = atol * scale + rtol * r.abs().double()
    near = (r.double() + 0.5 * tol).to(r.dtype)
    far = r.double().clone()
    far[N - 7] += 4.0 * float(tol[N - 7])
    out = {"same": r.clone(), "within half a tolerance": near, "one value four tolerances off": far.to(r.dtype)}
    for name, value in (("NaN", float("nan")), ("Inf", float("inf")), ("-Inf", float("-inf")),
                        ("overflowing", -3.0e38)):
        c = r.clone()
        c[values.CHUNK_ELEMENTS + 3] = value
        out[name] = c
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_lean_recheck_on_the_device_decides_as_the_general_one_and_the_host(dtype: torch.dtype) -> None:
    gen = torch.Generator(device="cuda").manual_seed(7)
    r = (torch.randn(N, device="cuda", generator=gen) * 3.0).to(dtype)
    atol, rtol, _ = values.tolerance_for(dtype, None, None, VerifyOptions())
    scale, finite = values._scale(r)
    assert finite
    expected = {"same": False, "within half a tolerance": False, "one value four tolerances off": True,
                "NaN": True, "Inf": True, "-Inf": True, "overflowing": True}
    for name, c in _outputs(r, scale, atol, rtol).items():
        lean = values._any_mismatch(c, r, torch.float32, atol, rtol, scale, finite_reference=True)
        general = values._any_mismatch(c, r, torch.float32, atol, rtol, scale)
        host = values.compare(c.cpu(), r.cpu(), atol, rtol, detail=False).passed
        device = values.compare(c, r, atol, rtol, detail=False).passed
        assert lean == general == (not host) == (not device), name
        if dtype == torch.float32:
            assert lean == expected[name], name
        else:
            assert lean or name not in ("NaN", "Inf", "-Inf", "overflowing"), name
