"""The bytes one optimizer step moves and touches per offloaded parameter: one byte model for the run's
timer (runtime/offload_timing.py) and the planner's speed bound (planning/); and what a pinned host block takes,
and what the library's offload leaves pinned."""

from __future__ import annotations

import math
from collections import Counter
from typing import Iterable

# fp32 Adam on the CPU reads param, grad, exp_avg, exp_avg_sq and writes param, exp_avg, exp_avg_sq.
ADAM_TOUCHED_BYTES_PER_FP32_PARAM = 7 * 4


def traffic_of(offloaded_params: int, stream: bool = False, moment_bytes: int = 4) -> dict[str, int]:
    """Bytes per step for ``offloaded_params`` fp32 parameters: fp32 gradients down (D2H), fp32 parameters
    up (H2D), and what the CPU Adam touches. ``stream`` (the offload engine's stream mode): Adam's two moments
    (``moment_bytes`` each: 4 in fp32, 2 in bf16) go up and come back, and the CPU touches nothing."""
    if stream:
        moments = 2 * moment_bytes * offloaded_params
        return {"offloaded_params": offloaded_params, "d2h_bytes": moments, "h2d_bytes": moments,
                "cpu_optimizer_bytes": 0}
    return {"offloaded_params": offloaded_params, "d2h_bytes": 4 * offloaded_params,
            "h2d_bytes": 4 * offloaded_params,
            "cpu_optimizer_bytes": ADAM_TOUCHED_BYTES_PER_FP32_PARAM * offloaded_params}


def pinned_block_bytes(nbytes: int) -> int:
    """What PyTorch's caching host allocator takes for a pinned request of ``nbytes``: a power of two."""
    return 1 << max(0, math.ceil(math.log2(max(nbytes, 1))))


def library_pinned_bytes(optimizers: Iterable[tuple[list[int], list[int]]]) -> int:
    """What PyTorch's caching host allocator holds after the first step of Megatron Core's optimizer offload, for
    each optimizer a pair (element counts of the bf16 parameters the discarded HybridDeviceOptimizer walked,
    element counts of the fp32 shards the training one offloaded), in the order Megatron builds them.

    The allocator rounds every block up to a power of two, keeps freed blocks and hands a cached block only to a
    request of the same power of two. Megatron Core 0.19.2 (hybrid_optimizer.py:_get_sub_optimizer_param_groups):
    the first HybridDeviceOptimizer (optimizer/__init__.py:532), built on the bf16 model parameters, pins a bf16
    copy of each tensor it offloads (line 274) and drops it at once for a pageable fp32 clone (line 278): one
    cached block per power of two, the embedding's first among them. The second (distrib_optimizer.py:779) pins
    an fp32 copy of each offloaded shard (line 274), the first step an fp32 gradient copy of each (line 109); both
    are kept, and take a cached block of their size where one is free."""
    free: Counter = Counter()
    total = 0

    def take(nbytes: int) -> int:
        nonlocal total
        block = pinned_block_bytes(nbytes)
        if free[block]:
            free[block] -= 1
        else:
            total += block
        return block

    optimizers = list(optimizers)
    for thrown_away, offloaded in optimizers:
        for n in thrown_away:
            free[take(2 * n)] += 1  # bf16 copy, dropped at once
        for n in offloaded:
            take(4 * n)  # fp32 parameter copy
    for _, offloaded in optimizers:  # the first step, optimizer by optimizer
        for n in offloaded:
            take(4 * n)  # fp32 gradient copy
    return total
