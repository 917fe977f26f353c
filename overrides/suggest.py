"""Did-you-mean for unknown keys, from the real field names of the config."""

from __future__ import annotations

import difflib
from typing import Any

from mbridge_offload.facts.config_tree import walk


def suggest(typed_key: str, root: Any, siblings: list[str], limit: int = 3) -> list[str]:
    """Closest real keys: first among the names where the walk stopped, then anywhere in the config
    whose last part matches (``model.optimizer_offload_fraction`` -> ``optimizer.optimizer_offload_fraction``)."""
    *parents, leaf = typed_key.split(".")
    prefix = ".".join(parents)
    near = [f"{prefix}.{name}" if prefix else name
            for name in difflib.get_close_matches(leaf, siblings, n=limit, cutoff=0.6)]
    near += [prefix + "." + name if prefix else name for name in siblings
             if len(leaf) >= 4 and (leaf in name or name in leaf) and (prefix + "." + name if prefix else name) not in near]
    all_keys = [key for key, _, _ in walk(root, levels=4)]  # dataclass fields and dict entries
    leaves = {}
    for key in all_keys:
        leaves.setdefault(key.rsplit(".", 1)[-1], []).append(key)
    for name in difflib.get_close_matches(leaf, list(leaves), n=limit, cutoff=0.8):
        near += [k for k in leaves[name] if k not in near and k != typed_key]
    near += [k for k in difflib.get_close_matches(typed_key, all_keys, n=limit, cutoff=0.75) if k not in near]
    return near[:limit]
