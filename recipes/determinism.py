"""Deterministic training as a transform: the keys and environment that make runs bit-reproducible."""

from __future__ import annotations

from mbridge_offload.facts.determinism import DETERMINISTIC_ENV, DETERMINISTIC_KEYS
from recipes.derive import derive


def with_deterministic_mode(cfg):
    """Bit-reproducible runs: Megatron's deterministic mode, the unfused cross entropy, and the
    environment deterministic kernels need (in ``env_vars``; a value set in the shell still wins)."""
    deltas = dict(DETERMINISTIC_KEYS)
    deltas.update({f"env_vars.{name}": value for name, value in DETERMINISTIC_ENV.items()})
    return derive(cfg, deltas, why="deterministic mode (bit-reproducible runs)")
