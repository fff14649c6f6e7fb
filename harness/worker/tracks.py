"""The numerics a verification runs the reference and the baselines in, per precision track (worker side).

The rule (docs/harness.md, "Precision tracks"):

* `fp32` (strict): TF32 off for matmul and cuDNN (`allow_tf32 = False` for both,
  `set_float32_matmul_precision("highest")`). The reference computes fp32 in fp32, and eager and
  torch.compile are timed that way: a TF32 baseline would make a strict candidate look slow, and a
  TF32 reference would hide a candidate's lowered precision.
* `tf32`: TF32 allowed for matmul and cuDNN (`"high"`), for the reference and both baselines.
* `bf16`, `fp16`: the reference stays the problem's own Model in the problem's own dtypes (it is
  not cast or autocast); TF32 is allowed as in `tf32`. The candidate may compute in the track's
  half precision (`harness.judgment.precision.TRACK_ALLOWS`), checked at the track's tolerance.

Every worker starts in the strict settings (`worker.main`) and returns to them after each
verification, so the baselines a worker times between verifications are strict ones. The precision
probes' reference runs in the strict settings on every track (`strict_numerics`): the probes hold a
kernel computing below its track's precision to the strict reference's accuracy.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from kb_mcp.harness.worker.trusted import TrustedSnapshot
from kb_mcp.kb.models import DEFAULT_TRACK, Track

# The global settings (`trusted._settings` keys) a track sets: the candidate must leave them as the
# harness set them for its track.
PRECISION_SETTINGS = (
    "torch.get_float32_matmul_precision()",
    "torch.backends.cuda.matmul.allow_tf32",
    "torch.backends.cudnn.allow_tf32",
)


def tf32_allowed(track: Track) -> bool:
    """Whether the reference and the baselines may use TF32 on `track` (all but the strict one)."""
    return track != Track.fp32


def set_numerics(track: Track) -> None:
    """Puts matmul and cuDNN in `track`'s mode (see the module's rule)."""
    allow = tf32_allowed(track)
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow
    torch.set_float32_matmul_precision("high" if allow else "highest")


def numerics() -> dict[str, object]:
    """The precision settings as they are now (what a worker reports it timed under)."""
    return {
        "matmul.allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn.allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


@contextmanager
def strict_numerics(track: Track) -> Iterator[None]:
    """The strict settings for the duration (the precision probes' reference), then `track`'s again."""
    set_numerics(DEFAULT_TRACK)
    try:
        yield
    finally:
        set_numerics(track)


@contextmanager
def track_numerics(track: Track, snapshot: TrustedSnapshot | None) -> Iterator[TrustedSnapshot | None]:
    """`track`'s numerics for the duration, then the strict ones again. Yields the trusted snapshot
    the candidate is checked against: `snapshot` with the precision settings as the track set them."""
    set_numerics(track)
    try:
        yield snapshot.with_settings_now(PRECISION_SETTINGS) if snapshot is not None else None
    finally:
        set_numerics(DEFAULT_TRACK)
