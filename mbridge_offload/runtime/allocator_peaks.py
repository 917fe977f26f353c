"""PyTorch's allocator peaks over the whole run, when something also reads the peak of shorter intervals.

``torch.cuda.max_memory_allocated`` is the peak since the last ``reset_peak_memory_stats``. The stream engine's
fetch-ahead (runtime/fetch_ahead.py) reads the peak between two hooks of a backward, which needs a reset at each
hook; the run's peaks, which the metrics record and the plan is checked against, are then the largest of those
intervals. Everything that reads a peak reads it here.
"""

from __future__ import annotations

_RUN_PEAK = {"allocated": 0, "reserved": 0}  # the largest peak of the intervals closed by interval_peak_allocated


def interval_peak_allocated() -> int:
    """The allocator's peak allocated bytes since the previous call (or the run's start), and start a new interval."""
    import torch

    # the nested form: memory_stats() flattens and sorts some 150 keys in Python, and this runs at every point of a
    # backward (runtime/fetch_ahead.py)
    stats = torch.cuda.memory_stats_as_nested_dict()
    allocated, reserved = _peak(stats, "allocated_bytes"), _peak(stats, "reserved_bytes")
    _RUN_PEAK["allocated"] = max(_RUN_PEAK["allocated"], allocated)
    _RUN_PEAK["reserved"] = max(_RUN_PEAK["reserved"], reserved)
    torch.cuda.reset_peak_memory_stats()
    return allocated


def _peak(stats: dict, name: str) -> int:
    return stats.get(name, {}).get("all", {}).get("peak", 0)


def run_peak_allocated() -> int:
    """The most memory PyTorch's tensors have held at once in this process: torch.cuda.max_memory_allocated,
    whatever resets it."""
    import torch

    return max(_RUN_PEAK["allocated"], torch.cuda.max_memory_allocated())


def run_peak_reserved() -> int:
    """The most memory PyTorch's allocator has reserved at once in this process (torch.cuda.max_memory_reserved)."""
    import torch

    return max(_RUN_PEAK["reserved"], torch.cuda.max_memory_reserved())
