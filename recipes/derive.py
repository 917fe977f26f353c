"""The one way this plugin changes a config: ``derive(cfg, deltas, why)`` returns a new config.

Recipes and offload transforms state only their deltas (dotted key -> value). The input is never
touched, so the same recipe can be composed, swept and compared against its original. Every value
that really changes is logged once, with the reason in words a user understands.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Any, Mapping

log = logging.getLogger("mbridge_offload")


class KeyPathError(KeyError):
    """A dotted key that does not name a field of the config (carries where the walk stopped)."""

    def __init__(self, key: str, missing: str, parent: Any):
        super().__init__(key)
        self.key = key
        self.missing = missing
        self.parent = parent

    def __str__(self) -> str:
        return f"{self.key!r}: {type(self.parent).__name__} has no field {self.missing!r}"


def _child(node: Any, name: str, key: str) -> Any:
    if isinstance(node, Mapping):
        if name not in node:
            raise KeyPathError(key, name, node)
        return node[name]
    if dataclasses.is_dataclass(node) and name in {f.name for f in dataclasses.fields(node)}:
        return getattr(node, name)
    raise KeyPathError(key, name, node)


def get_path(cfg: Any, key: str) -> Any:
    """Value at a dotted key (``optimizer.optimizer_offload_fraction``); KeyPathError if absent."""
    node = cfg
    for name in key.split("."):
        node = _child(node, name, key)
    return node


def set_path(cfg: Any, key: str, value: Any) -> None:
    """Set a dotted key in place (callers own ``cfg``: only used on copies)."""
    *parents, last = key.split(".")
    node = cfg
    for name in parents:
        node = _child(node, name, key)
    if isinstance(node, dict):
        node[last] = value
    else:
        _child(node, last, key)  # the field must exist: never invent attributes on a dataclass
        setattr(node, last, value)


def same_value(a: Any, b: Any) -> bool:
    """Equal and of the same type (so 1 and True, or 1 and 1.0, count as a change)."""
    return type(a) is type(b) and a == b


def show(value: Any) -> str:
    """A value as a user would type it in an override."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(show(v) for v in value) + "]"
    if hasattr(value, "name") and type(value).__module__ == "torch":  # torch.dtype
        return str(value).removeprefix("torch.")
    return str(value)


def derive(cfg: Any, deltas: Mapping[str, Any], why: str, check=None) -> Any:
    """Return a deep copy of ``cfg`` with ``deltas`` applied; log each real change once.

    ``check(new_cfg)`` may raise to refuse the result; nothing is logged then.
    """
    new = copy.deepcopy(cfg)
    changes = []
    for key, value in deltas.items():
        try:
            old = get_path(new, key)
        except KeyPathError as missing:
            # A new entry of a dict field (e.g. ``env_vars.NVTE_CPU_OFFLOAD_V1``) may be added.
            if not (isinstance(missing.parent, dict) and key.endswith("." + missing.missing)):
                raise
            old = "(unset)"
        if same_value(old, value):
            continue
        set_path(new, key, value)
        changes.append((key, old, value))
    if check is not None:
        check(new)
    for key, old, value in changes:
        log.info("%s: %s -> %s (%s)", key, show(old), show(value), why)
    return new
