"""Apply Hydra-grammar overrides to a copy of a ConfigContainer: typed, all errors at once.

    new_cfg = apply_overrides(cfg, ["optimizer.optimizer_offload_fraction=0.75", "train.train_iters=20"])

Semantics on dataclass configs: ``key=value`` changes a field; ``+key=value`` sets a field that is
unset (null) or adds a dict entry, creating a null section on the way (``+comm_overlap.x=...``);
``++key=value`` sets or adds; ``~key`` resets a field to its default or removes a dict entry.
The same key twice, a sweep, an unknown key, a wrong type or malformed grammar is refused (what cannot
be applied at all), and every refusal of one command is reported together, with the copy that has the
other overrides applied (``OverrideErrors.applied``), so that a caller can still validate it. Whether a
value is admissible (a range, a rule between keys) is the validator's question, asked on the final
values: ``mbridge_offload/validation`` (the ranges of ``facts/key_ranges.py`` are rules of its table).
The input config is never modified.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import types
import typing
from typing import Any, Sequence

from overrides.coerce import CoerceError, coerce, field_types
from overrides.errors import OverrideError, OverrideErrors
from overrides.grammar import ADD, CHANGE, DELETE, FORCE_ADD, ParsedOverride, parse
from overrides.suggest import suggest
from mbridge_offload.facts.config_tree import public_fields, show

log = logging.getLogger("mbridge_offload")


class _Refused(Exception):
    def __init__(self, message: str, fix: str = ""):
        super().__init__(message)
        self.message = message
        self.fix = fix


def _strip_optional(annotation: Any) -> Any:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


def _unknown(root: Any, ov: ParsedOverride, upto: int, node: Any) -> _Refused:
    parts = ov.key.split(".")
    typed = ".".join(parts[: upto + 1])
    if dataclasses.is_dataclass(node):
        siblings = [f.name for f in public_fields(node)]
        where = type(node).__name__
    else:
        siblings = [str(k) for k in node]
        where = "this dict"
    hints = suggest(typed, root, siblings)
    fix = ("did you mean " + " or ".join(hints) + "?") if hints else "see --dry-run output for the keys of this recipe"
    if isinstance(node, dict) and ov.op == CHANGE:
        fix += f"  (to add a new entry: +{ov.text})"
    return _Refused(f"unknown key: {where} has no {parts[upto]!r}", fix)


def _field(node: Any, name: str) -> dataclasses.Field | None:
    return next((f for f in public_fields(node) if f.name == name), None)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return copy.deepcopy(f.default)
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    raise _Refused("has no default to reset to", "set a value instead: key=value")


def _create_section(cls: type, section: str, ov: ParsedOverride, leaf_is_next: bool) -> Any:
    """A new section for ``+section.field=value``; a required field may be the one being set."""
    try:
        return cls()
    except TypeError as error:
        if not leaf_is_next:
            raise _Refused(f"{section} is null and cannot be created empty ({error})") from None
    leaf = ov.key.rsplit(".", 1)[-1]
    if leaf not in field_types(cls):
        raise _Refused(f"unknown key: {cls.__name__} has no {leaf!r}")
    try:
        return cls(**{leaf: coerce(ov.value, field_types(cls)[leaf], ov.raw)})
    except TypeError as error:
        raise _Refused(f"{section} is null and cannot be created from {leaf} alone ({error})") from None


def _walk_to_parent(root: Any, ov: ParsedOverride) -> tuple[Any, Any, bool]:
    """The node holding the last key part, the annotation of that node's values if a dict, and
    whether the node was created on the way (``+section.field=value`` on a null section)."""
    parts = ov.key.split(".")
    node, annotation, created = root, None, False
    for i, name in enumerate(parts[:-1]):
        if isinstance(node, dict):
            if name not in node:
                raise _unknown(root, ov, i, node)
            node, annotation = node[name], None
            continue
        if not dataclasses.is_dataclass(node) or _field(node, name) is None:
            if not dataclasses.is_dataclass(node) and not isinstance(node, dict):
                raise _Refused(f"{'.'.join(parts[:i])} is a value ({show(node)}), not a section")
            raise _unknown(root, ov, i, node)
        annotation = _strip_optional(field_types(type(node))[name])
        child = getattr(node, name)
        if child is None:
            section = ".".join(parts[: i + 1])
            if ov.op in (ADD, FORCE_ADD) and dataclasses.is_dataclass(annotation):
                child = _create_section(annotation, section, ov, leaf_is_next=i == len(parts) - 2)
                setattr(node, name, child)
                created = True
            elif ov.op in (ADD, FORCE_ADD) and typing.get_origin(annotation) is dict:
                child = {}
                setattr(node, name, child)
                created = True
            else:
                raise _Refused(f"{section} is null (not set by this recipe)",
                               f"create it and set the field: +{ov.text.lstrip('+')}")
        node = child
    if isinstance(node, dict) and typing.get_origin(annotation) is dict and len(typing.get_args(annotation)) == 2:
        return node, typing.get_args(annotation)[1], created
    return node, None, created


def _apply_one(root: Any, ov: ParsedOverride) -> tuple[Any, Any]:
    """Apply one override in place (on the copy); returns (old value, new value)."""
    node, dict_value_type, created = _walk_to_parent(root, ov)
    leaf = ov.key.rsplit(".", 1)[-1]
    if isinstance(node, dict):
        exists = leaf in node
        if ov.op == DELETE:
            if not exists:
                raise _Refused("no such entry to remove")
            if ov.has_value and node[leaf] != ov.value:
                raise _Refused(f"is {show(node[leaf])}, not {show(ov.value)}; nothing removed")
            return node.pop(leaf), "(removed)"
        if ov.op == CHANGE and not exists:
            raise _unknown(root, ov, len(ov.key.split(".")) - 1, node)
        if ov.op == ADD and exists:
            raise _Refused(f"already exists (= {show(node[leaf])})", f"change it with {ov.text.lstrip('+')}")
        old = node.get(leaf, "(unset)")
        new = coerce(ov.value, dict_value_type, ov.raw) if dict_value_type is not None else ov.value
        node[leaf] = new
        return old, new
    if not dataclasses.is_dataclass(node):
        raise _Refused(f"{ov.key.rsplit('.', 1)[0]} is a value ({show(node)}), not a section")
    f = _field(node, leaf)
    if f is None:
        raise _unknown(root, ov, len(ov.key.split(".")) - 1, node)
    old = getattr(node, leaf)
    if ov.op == DELETE:
        if ov.has_value and old != ov.value:
            raise _Refused(f"is {show(old)}, not {show(ov.value)}; nothing reset")
        new = _default(f)
    else:
        if ov.op == ADD and old is not None and not created:
            raise _Refused(f"is already set (= {show(old)}); '+' only sets what is unset",
                           f"change it with {ov.text.lstrip('+')}")
        new = coerce(ov.value, field_types(type(node))[leaf], ov.raw, old)
    setattr(node, leaf, new)
    return old, new


def apply_overrides(cfg: Any, texts: Sequence[str]) -> Any:
    """A copy of ``cfg`` with every override applied; OverrideErrors lists every refused one, and carries
    (``.applied``) a copy with the others applied. Values are not range-checked here (the validator does,
    on the final values)."""
    if isinstance(texts, str):
        raise TypeError("apply_overrides takes a list of overrides, not one string")
    parsed, errors = parse(list(texts))
    new = copy.deepcopy(cfg)
    first_text: dict[str, str] = {}
    changes = []
    for ov in parsed:
        if ov.is_sweep:
            errors.append(OverrideError(ov.text, ov.key, "is a sweep (several values); one run takes one value",
                                        "sweep with scripts/sweep_offload.py, or give a single value"))
            continue
        if ov.key in first_text:
            errors.append(OverrideError(ov.text, ov.key, f"given twice (first: {first_text[ov.key]})",
                                        "give each key once"))
            continue
        first_text[ov.key] = ov.text
        try:
            old, value = _apply_one(new, ov)
        except (_Refused, CoerceError) as refused:
            errors.append(OverrideError(ov.text, ov.key, refused.message, refused.fix))
            continue
        changes.append((ov.key, old, value))
    if errors:
        raise OverrideErrors(errors, applied=new)
    for key, old, value in changes:
        log.info("%s: %s -> %s (command-line override)", key, show(old), show(value))
    return new
