"""The floor of optimizer offload on a host: what the bytes each step must move cost at best.

With Megatron Core's HybridDeviceOptimizer the update of the offloaded parameters starts after the
backward pass (gradient clipping needs every gradient first) and must end before the next forward
pass. Each step therefore copies the offloaded gradients to the host (D2H, 4 bytes per fp32
parameter), runs Adam over them on the CPU (28 bytes of host memory touched per parameter) and copies
the parameters back (H2D, 4 bytes). Pipelined (D2H/H2D overlap in chunks, mbridge_offload/runtime/chunked_overlap.py)
the three run at once, so at best the slowest of them sets the time, and the Adam those parameters
no longer run on the GPU is saved:

    floor_s = baseline_step_s - gpu_adam_s + max(d2h_s, h2d_s, host_memory_s, host_memory_total_s)

The CPU Adam is bound by the bandwidth the cores reach; the copies are DMA and add to host memory's
total traffic, which the memory itself bounds:

    host_memory_s       = ranks on the node x Adam bytes / host memory bandwidth of the cores
    host_memory_total_s = ranks on the node x (Adam + D2H + H2D bytes) / total host memory bandwidth

Both measured on the H200 host (scripts/measure_host.py, docs/benchmarks/offload-overhead/host-concurrent/):
the cores' in-place add reaches 95-125 GB/s alone and 68-94 GB/s while pinned copies stream both ways,
so the copies do take from it, but all of it together moved 153-184 GB/s: enough for Adam's 28 bytes
plus the copies' 8 per parameter at the cores' rate, so on that host the cores' term binds. The
chunked-overlap step moved 36 bytes per parameter through host memory at 140 GB/s and met this floor
(docs/benchmarks/offload-overhead/dense-1b-chunked/). (The first version charged all 36 bytes to the
cores' 121 GB/s; that run beat it, so it was no floor.) On a host whose cores saturate its memory,
the total term binds instead.

``adam_floor_s`` prices the Adam part with the Adam this host actually runs (torch's fused CPU
AdamW, as HybridDeviceOptimizer uses) instead of raw bandwidth: the floor for this implementation.
Lowering the floor itself needs fewer bytes per step (a smaller fraction, lower-precision states).

This module is the model alone, arithmetic on bytes and rates; mbridge_offload/bench/host_measure.py
takes the measurements it prices with.
"""

from __future__ import annotations

from typing import Any

from mbridge_offload.facts.offload_bytes import ADAM_TOUCHED_BYTES_PER_FP32_PARAM
from mbridge_offload.facts.units import GB

# Host memory bandwidth of the project's H200 host (16 cores, in-place updates, all cores), measured with
# scripts/measure_host.py: docs/benchmarks/offload-overhead/host.json. The planner's default.
H200_HOST_MEMORY_GBPS = 121.3
# Bytes per offloaded parameter that pass through the cores' host memory bandwidth each step: Adam's.
HOST_BYTES_PER_OFFLOADED_PARAM = ADAM_TOUCHED_BYTES_PER_FP32_PARAM
# Total host memory traffic the H200 host served with the cores adding and both copy directions
# streaming: the best of 4 measurements (153-184 GB/s; docs/benchmarks/offload-overhead/host-concurrent/).
H200_HOST_MEMORY_TOTAL_GBPS = 183.6
BOUND_NAMES = {"d2h_s": "the D2H link", "h2d_s": "the H2D link", "host_memory_s": "host memory",
               "host_memory_total_s": "host memory with the copies"}


def best(measured: dict[str, float]) -> float:
    """The best rate over thread counts (the floor assumes the best this host can do)."""
    return max(measured.values())


def offload_time_lower_bound(traffic: dict[str, int], d2h_gbps: float, h2d_gbps: float, host_memory_gbps: float,
                             ranks_per_node: int = 1, host_memory_total_gbps: float | None = None) -> dict[str, Any]:
    """The least time one step's offload work takes, pipelined: each rank's copies run on its own link,
    the cores of a node serve the CPU Adam of all its ranks, and host memory serves all of it at once
    (without ``host_memory_total_gbps``, measured, that last term is left out)."""
    copies = traffic["d2h_bytes"] + traffic["h2d_bytes"]
    parts = {
        "d2h_s": traffic["d2h_bytes"] / (d2h_gbps * GB),
        "h2d_s": traffic["h2d_bytes"] / (h2d_gbps * GB),
        "host_memory_s": ranks_per_node * traffic["cpu_optimizer_bytes"] / (host_memory_gbps * GB),
    }
    if host_memory_total_gbps:
        parts["host_memory_total_s"] = ranks_per_node * (traffic["cpu_optimizer_bytes"] + copies) / (
            host_memory_total_gbps * GB)
    bound_by = max(parts, key=parts.get)
    return {**parts, "lower_bound_s": parts[bound_by], "bound_by": BOUND_NAMES[bound_by]}


def floor(traffic: dict[str, int], baseline_step_s: float, host: dict[str, Any]) -> dict[str, float]:
    """The floor of one offloaded step on one rank (module docstring), and its parts, in seconds."""
    cpu_bytes = traffic["cpu_optimizer_bytes"]
    bound = offload_time_lower_bound(traffic, host["d2h_gbps"], host["h2d_gbps"], best(host["host_memory_gbps"]),
                                     host_memory_total_gbps=host.get("host_memory_total_gbps"))
    cpu_adam_measured_s = cpu_bytes / (best(host["cpu_adam_gbps"]) * GB)
    gpu_adam_s = cpu_bytes / (host["device_memory_gbps"] * GB)
    floor_s = baseline_step_s - gpu_adam_s + bound["lower_bound_s"]
    return {
        "floor_s": floor_s,
        "floor_slowdown": floor_s / baseline_step_s,
        "adam_floor_s": baseline_step_s - gpu_adam_s + max(bound["d2h_s"], bound["h2d_s"], cpu_adam_measured_s),
        "d2h_s": bound["d2h_s"], "h2d_s": bound["h2d_s"], "host_memory_s": bound["host_memory_s"],
        "host_memory_total_s": bound.get("host_memory_total_s"),
        "cpu_adam_measured_s": cpu_adam_measured_s, "gpu_adam_saved_s": gpu_adam_s,
    }
