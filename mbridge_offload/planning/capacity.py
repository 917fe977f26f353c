"""The memory of the machine this runs on: what a plan made here checks against by default."""

from __future__ import annotations

from mbridge_offload.facts.proc import proc_kib
from mbridge_offload.facts.units import GIB

# What torch reports as an "80GB" H100's total memory (79.18 GiB: GPU makers' GB are 10^9 bytes, and CUDA keeps part),
# measured on the H100 80GB HBM3 the device runs used: a plan made without a GPU is for one of these. 80 would be
# 0.82 GiB more than the card has, which auto's 0.1 % margin with the full-device rule does not cover.
H100_80GB_GIB = 79.18


def host_memory_available_gib() -> float | None:
    """MemAvailable of this machine (the node a launch runs on), or None where unknown."""
    kib = proc_kib("MemAvailable", "/proc/meminfo")
    return None if kib is None else kib * 1024 / GIB


def gpu_memory_gib_here() -> float | None:
    """Memory of this machine's first GPU, or None without a usable one (torch is imported only where an
    NVIDIA device exists: a plan on a machine without one answers without that import)."""
    import glob

    if not glob.glob("/dev/nvidia[0-9]*") and not glob.glob("/dev/dxg"):
        return None
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).total_memory / GIB
    except Exception:  # noqa: BLE001  (no usable CUDA: the caller's default applies)
        pass
    return None
