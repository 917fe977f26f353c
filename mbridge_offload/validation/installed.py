"""What is installed: importable modules and the Transformer Engine version (rules of the environment
and of fine-grained offload depend on them)."""

from __future__ import annotations

import importlib.util


def module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def te_version() -> str | None:
    """Installed Transformer Engine version, or None when it cannot be imported."""
    if not module_available("transformer_engine"):
        return None
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("transformer-engine", "transformer_engine"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "unknown"


def version_tuple(text: str) -> tuple[int, ...]:
    """``2.10.0`` -> (2, 10, 0): the digits of the first three parts, for comparing versions."""
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def cuda_available() -> bool:
    """Whether this machine has a CUDA device torch can use (the GPU checks of Megatron Bridge's validate() need one)."""
    try:
        import torch
    except ImportError:
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken driver is no device to check against
        return False
