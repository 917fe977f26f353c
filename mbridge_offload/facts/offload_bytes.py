"""The bytes one optimizer step moves and touches per offloaded parameter: one byte model for the run's
timer (runtime/offload_timing.py) and the planner's speed bound (planning/); and what a pinned host block takes."""

from __future__ import annotations

import math

# fp32 Adam on the CPU reads param, grad, exp_avg, exp_avg_sq and writes param, exp_avg, exp_avg_sq.
ADAM_TOUCHED_BYTES_PER_FP32_PARAM = 7 * 4


def traffic_of(offloaded_params: int, stream: bool = False) -> dict[str, int]:
    """Bytes per step for ``offloaded_params`` fp32 parameters: fp32 gradients down (D2H), fp32 parameters
    up (H2D), and what the CPU Adam touches. ``stream`` (the offload engine's stream mode): Adam's two fp32
    moments go up and come back, and the CPU touches nothing."""
    if stream:
        return {"offloaded_params": offloaded_params, "d2h_bytes": 8 * offloaded_params,
                "h2d_bytes": 8 * offloaded_params, "cpu_optimizer_bytes": 0}
    return {"offloaded_params": offloaded_params, "d2h_bytes": 4 * offloaded_params,
            "h2d_bytes": 4 * offloaded_params,
            "cpu_optimizer_bytes": ADAM_TOUCHED_BYTES_PER_FP32_PARAM * offloaded_params}


def pinned_block_bytes(nbytes: int) -> int:
    """What PyTorch's caching host allocator takes for a pinned request of ``nbytes``: a power of two."""
    return 1 << max(0, math.ceil(math.log2(max(nbytes, 1))))
