"""L2 persistence (worker side): the persisting set-aside and the current stream's access-policy window,
read and reset through the CUDA driver API."""

from __future__ import annotations

import ctypes

import torch
from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.harness.judgment.verdict import Finding, FindingCode

CU_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06
CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW = 1


class L2State(BaseModel):
    """The L2 persisting set-aside and the access-policy window of the streams checked."""

    model_config = ConfigDict(extra="forbid")

    persisting_limit_bytes: int | None = None  # None when the driver could not be asked
    window_bytes: dict[str, int] = Field(default_factory=dict)  # stream label -> window size
    error: str | None = None

    @property
    def persistent(self) -> bool:
        """True when some L2 lines can persist across the harness's flush."""
        return bool(self.persisting_limit_bytes) or any(v > 0 for v in self.window_bytes.values())


def _libcuda() -> ctypes.CDLL:
    try:
        from torch.cuda._utils import _get_gpu_runtime_library

        return _get_gpu_runtime_library()
    except Exception:  # noqa: BLE001 - a torch without the helper: load the driver by name
        return ctypes.CDLL("libcuda.so.1")


def _streams() -> list[tuple[str, int]]:
    current = torch.cuda.current_stream()
    default = torch.cuda.default_stream()
    out = [("current", int(current.cuda_stream))]
    if int(default.cuda_stream) != int(current.cuda_stream):
        out.append(("default", int(default.cuda_stream)))
    return out


def l2_state() -> L2State:
    """Reads the persisting-L2 limit and each checked stream's access-policy window size."""
    if not torch.cuda.is_available():
        return L2State(error="no CUDA device")
    try:
        lib = _libcuda()
        value = ctypes.c_size_t(0)
        rc = lib.cuCtxGetLimit(ctypes.byref(value), ctypes.c_int(CU_LIMIT_PERSISTING_L2_CACHE_SIZE))
        if rc != 0:
            return L2State(error=f"cuCtxGetLimit returned {rc}")
        windows: dict[str, int] = {}
        for label, handle in _streams():
            buf = (ctypes.c_ubyte * 64)()  # CUlaunchAttributeValue is a 64-byte union
            rc = lib.cuStreamGetAttribute(
                ctypes.c_void_p(handle), ctypes.c_int(CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW), ctypes.byref(buf)
            )
            if rc == 0:
                # accessPolicyWindow: void* base_ptr; size_t num_bytes; float hitRatio; ...
                windows[label] = int.from_bytes(bytes(buf[8:16]), "little")
        return L2State(persisting_limit_bytes=int(value.value), window_bytes=windows)
    except Exception as exc:  # noqa: BLE001 - driver missing or symbol absent
        return L2State(error=f"{type(exc).__name__}: {exc}")


def reset_l2_persistence() -> None:
    """Clears the persisting set-aside, the checked streams' windows and any persisting lines."""
    if not torch.cuda.is_available():
        return
    lib = _libcuda()
    for _label, handle in _streams():
        buf = (ctypes.c_ubyte * 64)()
        lib.cuStreamSetAttribute(
            ctypes.c_void_p(handle), ctypes.c_int(CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW), ctypes.byref(buf)
        )
    lib.cuCtxResetPersistingL2Cache()
    lib.cuCtxSetLimit(ctypes.c_int(CU_LIMIT_PERSISTING_L2_CACHE_SIZE), ctypes.c_size_t(0))


def l2_findings(state: L2State) -> list[Finding]:
    """`l2_persistence` when a persisting set-aside or access-policy window is in place."""
    if not state.persistent:
        return []
    return [
        Finding(
            code=FindingCode.l2_persistence,
            message=(
                f"after the candidate ran, L2 persistence was configured (persisting set-aside "
                f"{state.persisting_limit_bytes} bytes, access-policy windows {state.window_bytes}); "
                "persisting lines survive the harness's L2 flush and make timings unrepresentative. "
                "Remove cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize) and access-policy windows"
            ),
            source="runtime",
        )
    ]

