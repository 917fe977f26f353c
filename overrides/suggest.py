"""Did-you-mean for unknown keys, from the real field names of the config."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Iterator


def dotted_keys(node: Any, prefix: str = "", depth: int = 0) -> Iterator[str]:
    """Every dotted key of a config (dataclass fields and dict entries), three levels deep."""
    if depth > 3:
        return
    if dataclasses.is_dataclass(node):
        names = [f.name for f in dataclasses.fields(node) if not f.name.startswith("_")]
        children = ((name, getattr(node, name, None)) for name in names)
    elif isinstance(node, dict):
        children = ((str(k), v) for k, v in node.items())
    else:
        return
    for name, child in children:
        key = prefix + name
        yield key
        yield from dotted_keys(child, key + ".", depth + 1)


def suggest(typed_key: str, root: Any, siblings: list[str], limit: int = 3) -> list[str]:
    """Closest real keys: first among the names where the walk stopped, then anywhere in the config
    whose last part matches (``model.optimizer_offload_fraction`` -> ``optimizer.optimizer_offload_fraction``)."""
    *parents, leaf = typed_key.split(".")
    prefix = ".".join(parents)
    near = [f"{prefix}.{name}" if prefix else name
            for name in difflib.get_close_matches(leaf, siblings, n=limit, cutoff=0.6)]
    near += [prefix + "." + name if prefix else name for name in siblings
             if len(leaf) >= 4 and (leaf in name or name in leaf) and (prefix + "." + name if prefix else name) not in near]
    all_keys = list(dotted_keys(root))
    leaves = {}
    for key in all_keys:
        leaves.setdefault(key.rsplit(".", 1)[-1], []).append(key)
    for name in difflib.get_close_matches(leaf, list(leaves), n=limit, cutoff=0.8):
        near += [k for k in leaves[name] if k not in near and k != typed_key]
    near += [k for k in difflib.get_close_matches(typed_key, all_keys, n=limit, cutoff=0.75) if k not in near]
    return near[:limit]
