"""Did-you-mean for unknown keys, from the real field names of the config."""

from __future__ import annotations

from typing import Any

from mbridge_offload.facts.config_tree import walk
from mbridge_offload.facts.spelling import close_words as _close


def suggest(typed_key: str, root: Any, siblings: list[str], limit: int = 3, upto: int | None = None) -> list[str]:
    """Closest real keys to ``typed_key``, whose part number ``upto`` (default: the last) is the unknown
    one, ``siblings`` the names where the walk stopped. A typo in the middle of a path is corrected with the
    rest of the path kept (``optimzer.lr`` -> ``optimizer.lr``); a name under the wrong section is found
    where it is (``model.optimizer_offload_fraction`` -> ``optimizer.optimizer_offload_fraction``)."""
    parts = typed_key.split(".")
    upto = len(parts) - 1 if upto is None else upto
    prefix, bad, rest = ".".join(parts[:upto]), parts[upto], parts[upto + 1:]
    all_keys = [key for key, _, _ in walk(root, levels=max(4, len(parts)))]  # dataclass fields and dict entries
    known = set(all_keys)

    def joined(*pieces: str) -> str:
        return ".".join(p for p in pieces if p)

    names = _close(bad, siblings, limit, 0.6)
    names += [name for name in siblings if len(bad) >= 4 and (bad in name or name in bad) and name not in names]
    near: list[str] = []
    for name in names:
        corrected = joined(prefix, name, *rest)
        if not rest or corrected in known:
            near.append(corrected)
            continue
        below = [key for key in all_keys if key.startswith(joined(prefix, name) + ".")]
        near += [key for key in _close(corrected, below, 1, 0.6) if key not in near]
    if not near and rest:  # the right section is named nowhere near: the path as far as it was typed
        near += [joined(prefix, name) for name in names]
    if upto == len(parts) - 1:  # the last part: the same name under another section
        leaves: dict[str, list[str]] = {}
        for key in all_keys:
            leaves.setdefault(key.rsplit(".", 1)[-1], []).append(key)
        for name in _close(bad, list(leaves), limit, 0.8):
            near += [k for k in leaves[name] if k not in near and k != typed_key]
    near += [k for k in _close(typed_key, all_keys, limit, 0.75) if k not in near]
    return near[:limit]
