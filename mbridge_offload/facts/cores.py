"""The CPU cores this process may run on."""

from __future__ import annotations

import os


def available_cores() -> list[int]:
    """The cores this process may run on (its affinity where the OS reports it)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))
