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
