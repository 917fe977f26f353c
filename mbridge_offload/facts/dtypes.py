"""Bytes per element of a dtype: one notion of "below fp32" for the planner and the rules."""

from __future__ import annotations

from typing import Any


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of a torch dtype (4 where it is not one)."""
    return getattr(dtype, "itemsize", None) or 4
