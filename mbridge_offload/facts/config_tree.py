"""Walking a config tree by dotted key (``optimizer.optimizer_offload_fraction``), visiting all of its
keys, and showing values as a user would type them in an override. Works on dataclasses and dicts;
knows nothing of Megatron."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Mapping


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


def public_fields(node: Any) -> list[dataclasses.Field]:
    """The fields of a dataclass a user may set (``_``-prefixed ones are the config's own state)."""
    return [f for f in dataclasses.fields(node) if not f.name.startswith("_")]


def walk(node: Any, levels: int, into_dict: Callable[[str], bool] | None = None,
         private: bool = False) -> Iterator[tuple[str, Any, bool]]:
    """Every ``(dotted key, value, is_section)`` below ``node``, a section before its own keys, keys
    of at most ``levels`` parts. A section is a dataclass (its public fields; with ``private`` its
    ``_``-prefixed ones too) or a dict (its entries; only where ``into_dict(key)`` is true, when
    given); anything else, or anything ``levels`` deep, is a leaf."""

    def visit(node: Any, prefix: str, depth: int) -> Iterator[tuple[str, Any, bool]]:
        if dataclasses.is_dataclass(node):
            names = [f.name for f in (dataclasses.fields(node) if private else public_fields(node))]
            children = [(name, getattr(node, name, None)) for name in names]
        else:
            children = [(str(name), value) for name, value in node.items()]
        for name, child in children:
            key = prefix + name
            is_section = depth < levels and (dataclasses.is_dataclass(child) or (
                isinstance(child, dict) and (into_dict is None or into_dict(key))))
            yield key, child, is_section
            if is_section:
                yield from visit(child, key + ".", depth + 1)

    if dataclasses.is_dataclass(node) or isinstance(node, dict):
        yield from visit(node, "", 1)


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
