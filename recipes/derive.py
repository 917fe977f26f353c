"""The one way this plugin changes a config: ``derive(cfg, deltas, why)`` returns a new config.

Recipes and offload transforms state only their deltas (dotted key -> value). The input is never
touched, so the same recipe can be composed, swept and compared against its original. Every value
that really changes is logged once, with the reason in words a user understands.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Mapping

from mbridge_offload.facts.config_tree import KeyPathError, get_path, same_value, set_path, show

log = logging.getLogger("mbridge_offload")


def derive(cfg: Any, deltas: Mapping[str, Any], why: str, check=None) -> Any:
    """Return a deep copy of ``cfg`` with ``deltas`` applied; log each real change once.

    ``check(new_cfg)`` may raise to refuse the result; nothing is logged then.
    """
    _refuse_non_config(cfg, deltas)
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


def _refuse_non_config(cfg: Any, deltas: Mapping[str, Any]) -> None:
    """A transform takes a built config: say so by type, not by the first key the walk cannot find. The likely
    mistake is passing ``get_recipe(name)``, the registry's entry, instead of what its ``build()`` returns."""
    sections = {key.split(".", 1)[0] for key in deltas}
    if all(hasattr(cfg, section) for section in sections):
        return
    build = getattr(cfg, "build", None)
    if callable(build) and hasattr(cfg, "name"):
        hint = f": build it first, get_recipe({cfg.name!r}).build()"
    elif callable(cfg) and not isinstance(cfg, type):
        hint = f": {getattr(cfg, '__qualname__', 'it')} is the recipe function, call it first: {_call_of(cfg)}"
    else:
        hint = ": pass the ConfigContainer a recipe function returns"
    raise TypeError(f"a transform takes a Megatron Bridge ConfigContainer, got {type(cfg).__name__} "
                    f"(it has no {', '.join(sorted(s for s in sections if not hasattr(cfg, s)))} section){hint}")


def _call_of(function: Any) -> str:
    """How to call the recipe function passed instead of its config: ``name()``, or ``get_recipe(name).build()``
    for a registry entry's bound ``build``."""
    owner = getattr(function, "__self__", None)
    if owner is not None and hasattr(owner, "name"):
        return f"get_recipe({owner.name!r}).build()"
    return f"{getattr(function, '__name__', 'recipe')}()"
