"""State of compressed allreduce (Comm.allreduce_compressed): the method,
the ratio, the error-feedback residual of each buffer, and the call counter
from which RandomK's shared seed derives. Pure Python; the selection and
the communication are libnexar's (nexar_allreduce_compressed)."""

from __future__ import annotations

from typing import Dict, Hashable, Optional

TOPK = 1  # NEXAR_COMPRESS_TOPK
RANDOMK = 2  # NEXAR_COMPRESS_RANDOMK
_METHODS = {"topk": TOPK, "randomk": RANDOMK, TOPK: TOPK, RANDOMK: RANDOMK}
_MASK = (1 << 64) - 1


class CompressState:
    """What a compressed allreduce keeps between calls, on one rank.

    method: "topk" (each rank's largest magnitudes) or "randomk" (indices
    drawn from a seed every rank shares). ratio: the fraction of elements
    sent, in (0, 1]. error_feedback: keep per buffer what was not sent and
    add it to the next call's input (default: on for topk; off for randomk,
    whose values are then scaled by n/k, an unbiased estimate; with error
    feedback RandomK sends unscaled values). seed: mixed with the number
    of calls made so far into each call's RandomK seed, so ranks that make
    the same calls in the same order draw the same indices.

    residuals maps a buffer key (Comm.allreduce_compressed's key, the
    bucket index in the torch hook) to its residual; a buffer whose size
    changed starts again from zeros. Not safe for concurrent use.
    """

    def __init__(self, method="topk", ratio: float = 0.01, error_feedback: Optional[bool] = None,
                 seed: int = 0):
        try:
            self.method = _METHODS[method.lower() if isinstance(method, str) else method]
        except KeyError:
            raise ValueError(f"nexar: unknown compression method {method!r} (topk or randomk)") from None
        if not 0 < ratio <= 1:
            raise ValueError(f"nexar: compression ratio {ratio} is not in (0, 1]")
        self.ratio = float(ratio)
        self.error_feedback = (self.method == TOPK) if error_feedback is None else bool(error_feedback)
        self.seed = int(seed) & _MASK
        self.calls = 0
        self.residuals: Dict[Hashable, object] = {}

    def next_seed(self) -> int:
        """The seed of the next call (and count it)."""
        s = (self.seed * 0x9E3779B97F4A7C15 + self.calls) & _MASK
        self.calls += 1
        return s

    def residual(self, key: Hashable, like):
        """The residual of buffer key, zeros of like's size (float32, the
        kind of like: torch tensor or numpy array) when new or resized."""
        n = like.numel() if hasattr(like, "numel") else like.size
        r = self.residuals.get(key)
        if r is None or (r.numel() if hasattr(r, "numel") else r.size) != n:
            if hasattr(like, "numel"):
                import torch
                r = torch.zeros(n, dtype=torch.float32)
            else:
                import numpy as np
                r = np.zeros(n, dtype=np.float32)
            self.residuals[key] = r
        return r

    def __repr__(self):
        m = "topk" if self.method == TOPK else "randomk"
        return (f"CompressState({m!r}, ratio={self.ratio}, error_feedback={self.error_feedback}, "
                f"calls={self.calls}, buffers={len(self.residuals)})")
