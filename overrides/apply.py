"""Apply Hydra-grammar overrides to a copy of a ConfigContainer: typed, all errors at once.

    new_cfg = apply_overrides(cfg, ["optimizer.optimizer_offload_fraction=0.75", "train.train_iters=20"])

Semantics on dataclass configs: ``key=value`` changes a field (a dict given over a dict is merged into it, entry
by entry, as Hydra merges it); ``+key=value`` sets a field that is
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

from overrides.coerce import CoerceError, allows_null, coerce, describe, field_types
from overrides.errors import OverrideError, OverrideErrors, shown
from overrides.grammar import ADD, CHANGE, DELETE, FORCE_ADD, ParsedOverride, parse, value_text_of
from overrides.suggest import suggest
from mbridge_offload.facts.config_tree import public_fields, show
from mbridge_offload.facts.key_ranges import OFFLOAD_FRACTION_KEY

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


# Did-you-mean reads every key of the config (~10 ms for a recipe): the unknown keys of one command past this many are
# named without it, so that thousands of them (a generated or corrupted list) are answered in seconds, not minutes.
SUGGESTED_UNKNOWN_KEYS = 50


def _unknown(root: Any, ov: ParsedOverride, upto: int, node: Any, with_suggestions: bool = True) -> _Refused:
    parts = ov.key.split(".")
    if dataclasses.is_dataclass(node):
        siblings = [f.name for f in public_fields(node)]
        where = type(node).__name__
    else:
        siblings = [str(k) for k in node]
        where = "this dict"
    hints = suggest(ov.key, root, siblings, upto=upto) if with_suggestions else []
    fix = ("did you mean " + " or ".join(hints) + "?") if hints else "see --dry-run output for the keys of this recipe"
    if not with_suggestions:
        fix += f" (did-you-mean is given for the first {SUGGESTED_UNKNOWN_KEYS} unknown keys of a command)"
    if isinstance(node, dict) and ov.op == CHANGE and upto == len(parts) - 1:
        fix += f"  (to add a new entry: +{ov.text})"
    return _Refused(f"unknown key: {where} has no {parts[upto]!r}", fix)


def _field(node: Any, name: str) -> dataclasses.Field | None:
    return next((f for f in public_fields(node) if f.name == name), None)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return copy.deepcopy(f.default)
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        try:
            return f.default_factory()  # type: ignore[misc]
        except Exception as error:  # noqa: BLE001 - a factory that needs more than nothing
            raise _Refused(f"its default cannot be made here ({type(error).__name__})",
                           "set a value instead: key=value") from None
    raise _Refused("has no default to reset to", "set a value instead: key=value")


def _merged(old: Any, new: Any) -> Any:
    """A dict given over a dict is merged into it, entry by entry, as Hydra does (OmegaConf.update with merge=True):
    ``env_vars={A:1}`` adds A and keeps the recipe's other variables (``~env_vars.NAME`` removes one)."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return new
    merged = copy.deepcopy(old)
    for name, value in new.items():
        merged[name] = _merged(merged.get(name), value)
    return merged


def _is_none_word(ov: ParsedOverride) -> bool:
    """``key=None`` unquoted: Python's word for null, which Hydra reads as the text 'None'."""
    return ov.value == "None" and not ov.quoted


class _Application:
    """One command's overrides applied, one by one, onto ``root`` (the copy). Sections that a ``+`` override
    creates count as unset for every override of the command, so the order of the overrides does not matter
    (``+section.a=1 +section.b=2`` works in either order, whichever field the section needs to be made)."""

    def __init__(self, root: Any, parsed: list[ParsedOverride]):
        self.root = root
        self.parsed = parsed
        self.created: set[str] = set()  # dotted paths of the sections created by this command
        self.unknown_keys = 0

    def _unknown(self, ov: ParsedOverride, upto: int, node: Any) -> _Refused:
        self.unknown_keys += 1
        return _unknown(self.root, ov, upto, node, with_suggestions=self.unknown_keys <= SUGGESTED_UNKNOWN_KEYS)

    def _create_section(self, cls: type, section: str, ov: ParsedOverride) -> Any:
        """A new section for ``+section.field=value``, made with every field this command gives it directly
        (a required field may be given by another override of the command)."""
        try:
            return cls()
        except TypeError:
            pass
        except Exception as error:  # noqa: BLE001 - its __post_init__ refused being made empty
            raise _Refused(f"{section} is null and cannot be created ({type(error).__name__}: {error})",
                           f"set {section} in Python (a recipe), or leave it null") from None
        types_ = field_types(cls)
        given: dict[str, Any] = {}
        refused: dict[str, str] = {}  # field -> the override of this command whose value it cannot take
        for other in self.parsed:
            if other.is_sweep or other.op not in (ADD, FORCE_ADD) or not other.key.startswith(section + "."):
                continue
            leaf = other.key[len(section) + 1:]
            if "." in leaf or leaf not in types_:
                continue
            try:
                given[leaf] = coerce(None if _is_none_word(other) and allows_null(types_[leaf]) else other.value,
                                     types_[leaf], other.raw, key=other.key)
            except CoerceError:
                if other is ov:
                    raise  # this override's own value is what is wrong
                refused[leaf] = other.text  # that override's own error says why
        required = [f.name for f in dataclasses.fields(cls) if f.init and f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING]  # type: ignore[misc]
        missing = [name for name in required if name not in given]
        if missing:
            waiting = [refused[name] for name in missing if name in refused]
            raise _Refused(f"{section} is null, and creating it needs {', '.join(missing)} too"
                           + (f" ({', '.join(waiting)} is refused: see its own error)" if waiting else ""),
                           " ".join(f"+{section}.{name}=<{describe(types_.get(name, Any))}>" for name in missing)
                           + f" (with +{ov.key}=...)")
        try:
            return cls(**given)
        except Exception as error:  # noqa: BLE001 - abstract, or the section's own checks refused these values
            made_from = f" from {', '.join(f'{k}={show(v)}' for k, v in given.items())}" if given else ""
            raise _Refused(f"{section} is null and a {cls.__name__} cannot be created here{made_from} "
                           f"({type(error).__name__}: {error})",
                           f"set {section} in Python (a recipe), or leave it null") from None

    def _walk_to_parent(self, ov: ParsedOverride) -> tuple[Any, Any, bool]:
        """The node holding the last key part, the annotation of that node's values if a dict, and
        whether that node was created by this command (``+section.field=value`` on a null section)."""
        parts = ov.key.split(".")
        node, annotation = self.root, None
        for i, name in enumerate(parts[:-1]):
            if isinstance(node, dict):
                if name not in node:
                    raise self._unknown(ov, i, node)
                node, annotation = node[name], None
                continue
            if not dataclasses.is_dataclass(node) or _field(node, name) is None:
                if not dataclasses.is_dataclass(node) and not isinstance(node, dict):
                    raise _Refused(f"{'.'.join(parts[:i])} is a value ({show(node)}), not a section",
                                   f"set it whole: {'.'.join(parts[:i])}=<value>")
                raise self._unknown(ov, i, node)
            annotation = _strip_optional(field_types(type(node))[name])
            child = getattr(node, name)
            section = ".".join(parts[: i + 1])
            if child is None:
                if ov.op in (ADD, FORCE_ADD) and dataclasses.is_dataclass(annotation):
                    child = self._create_section(annotation, section, ov)
                elif ov.op in (ADD, FORCE_ADD) and typing.get_origin(annotation) is dict:
                    child = {}
                elif ov.op == DELETE:
                    raise _Refused(f"{section} is null (not set by this recipe): nothing to reset",
                                   f"drop {ov.text}")
                else:
                    raise _Refused(f"{section} is null (not set by this recipe)",
                                   f"create it and set the field: +{ov.text.lstrip('+')}")
                setattr(node, name, child)
                self.created.add(section)
            node = child
        created = ".".join(parts[:-1]) in self.created
        if isinstance(node, dict) and typing.get_origin(annotation) is dict and len(typing.get_args(annotation)) == 2:
            return node, typing.get_args(annotation)[1], created
        return node, None, created

    def apply(self, ov: ParsedOverride) -> tuple[Any, Any]:
        """Apply one override in place (on the copy); returns (old value, new value)."""
        node, dict_value_type, created = self._walk_to_parent(ov)
        leaf = ov.key.rsplit(".", 1)[-1]
        if isinstance(node, dict):
            exists = leaf in node
            if ov.op == DELETE:
                if not exists:
                    raise _Refused("no such entry to remove", f"drop {ov.text}")
                if ov.has_value and node[leaf] != ov.value:
                    raise _Refused(f"is {show(node[leaf])}, not {show(ov.value)}; nothing removed", f"~{ov.key}")
                return node.pop(leaf), "(removed)"
            if ov.op == CHANGE and not exists:
                raise self._unknown(ov, len(ov.key.split(".")) - 1, node)
            if ov.op == ADD and exists and not created:
                raise _Refused(f"already exists (= {show(node[leaf])})", f"change it with {ov.text.lstrip('+')}")
            old = node.get(leaf, "(unset)")
            new = (coerce(ov.value, dict_value_type, ov.raw, key=ov.key) if dict_value_type is not None
                   else ov.value)
            new = _merged(old, new)
            node[leaf] = new
            return old, new
        if not dataclasses.is_dataclass(node):
            parent = ov.key.rsplit('.', 1)[0]
            raise _Refused(f"{parent} is a value ({show(node)}), not a section", f"set it whole: {parent}=<value>")
        f = _field(node, leaf)
        if f is None:
            raise self._unknown(ov, len(ov.key.split(".")) - 1, node)
        old = getattr(node, leaf)
        annotation = field_types(type(node))[leaf]
        if ov.op == DELETE:
            if ov.has_value and old != ov.value:
                raise _Refused(f"is {show(old)}, not {show(ov.value)}; nothing reset", f"~{ov.key}")
            new = _default(f)
        else:
            if ov.op == ADD and old is not None and not created:
                raise _Refused(f"is already set (= {show(old)}); '+' only sets what is unset",
                               f"change it with {ov.text.lstrip('+')}")
            value = ov.value
            if _is_none_word(ov):
                if allows_null(annotation):
                    value = None
                elif annotation not in (str, Any) and typing.get_origin(annotation) is not typing.Literal:
                    # (a choice field reads None itself: cuda_graph_impl=None gets "did you mean none")
                    raise _Refused(f"expects {describe(annotation)}, got None (this field cannot be null)",
                                   f"{ov.key}=<{describe(annotation)}>")
            new = _merged(old, coerce(value, annotation, ov.raw, old, key=ov.key))
        setattr(node, leaf, new)
        return old, new


def _is_list_field(root: Any, key: str) -> bool:
    """Whether ``key`` names a field declared as a list (``a,b`` there is more likely a list than a sweep)."""
    *parents, leaf = key.split(".")
    node = root
    for name in parents:
        node = getattr(node, name, None) if dataclasses.is_dataclass(node) else None
    if not dataclasses.is_dataclass(node) or _field(node, leaf) is None:
        return False
    declared = _strip_optional(field_types(type(node))[leaf])
    return typing.get_origin(declared) in (list, tuple, set, frozenset) or declared in (list, tuple)


def _auto_hint(ov: ParsedOverride, fix: str) -> str:
    """``auto`` for the offload fraction in another spelling, or where nothing resolves it: say how it is written
    and where it works (the commands resolve ``optimizer.optimizer_offload_fraction=auto``:
    mbridge_offload/prepare.py)."""
    if ov.key != OFFLOAD_FRACTION_KEY or not isinstance(ov.value, str) or ov.value.strip().lower() != "auto":
        return fix
    return (f"{OFFLOAD_FRACTION_KEY}=auto, written exactly so, is resolved by run_recipe.py and plan_offload.py "
            f"(the smallest fraction that fits); elsewhere give a number: {OFFLOAD_FRACTION_KEY}=0.5")


def _conflicts(parsed: list[ParsedOverride]) -> dict[int, OverrideError]:
    """Overrides whose keys are the same, or one inside the other (``~env_vars`` and ``+env_vars.X=1``):
    the result would depend on their order, so every one after the first is refused."""
    errors: dict[int, OverrideError] = {}
    # the first override kept for each key, and for each section above a kept key (looked up, not searched: a
    # command of thousands of overrides is checked in linear time)
    seen: dict[str, tuple[int, ParsedOverride]] = {}
    below: dict[str, tuple[int, ParsedOverride]] = {}
    for ov in parsed:
        if ov.is_sweep:
            continue
        same = seen[ov.key][1] if ov.key in seen else None
        parts = ov.key.split(".")
        candidates = [seen[p] for p in (".".join(parts[:n]) for n in range(1, len(parts))) if p in seen]
        candidates += [below[ov.key]] if ov.key in below else []
        inside = min(candidates, key=lambda kept: kept[0])[1] if candidates else None
        if same is not None:
            errors[ov.index] = OverrideError(text=ov.text,
                                             key=ov.key,
                                             message=(f"given twice (first: {shown(same.text, 120)}); Hydra would "
                                                      "apply both and keep the last, which hides a stale or mistyped "
                                                      "argument: a command here takes each key once"),
                                             fix=f"keep the one you mean: {shown(same.text, 120)} or "
                                                 f"{shown(ov.text, 120)}",
                                             index=ov.index)
        elif inside is not None:
            outer, inner = (inside, ov) if ov.key.startswith(inside.key + ".") else (ov, inside)
            errors[ov.index] = OverrideError(text=ov.text,
                                             key=ov.key,
                                             message=(f"overlaps {shown(inside.text, 120)}: {outer.key} contains "
                                                      f"{inner.key}, so the result would depend on their order"),
                                             fix=f"give one of them (set {outer.key} whole, or only its parts)",
                                             index=ov.index)
        else:
            order = len(seen)
            seen[ov.key] = (order, ov)
            for n in range(1, len(parts)):
                below.setdefault(".".join(parts[:n]), (order, ov))
    return errors


def apply_overrides(cfg: Any, texts: Sequence[str]) -> Any:
    """A copy of ``cfg`` with every override applied; OverrideErrors lists every refused one, in the command's
    order, and carries (``.applied``) a copy with the others applied. Values are not range-checked here (the
    validator does, on the final values)."""
    if isinstance(texts, str):
        raise TypeError("apply_overrides takes a list of overrides, not one string")
    parsed, errors = parse(list(texts))
    new = copy.deepcopy(cfg)
    refused = _conflicts(parsed)
    application = _Application(new, [ov for ov in parsed if ov.index not in refused])
    changes = []
    for ov in parsed:
        if ov.is_sweep:
            typed = value_text_of(ov.text) or ""
            as_list = (f"; for a list: {ov.key}=[{typed}]" if _is_list_field(new, ov.key)
                       and not any(c in typed for c in "[]{}()'\"") else "")
            errors.append(OverrideError(text=ov.text,
                                        key=ov.key,
                                        message="is a sweep (several values); one run takes one value",
                                        fix=f"sweep with scripts/sweep_offload.py, or give a single value{as_list}",
                                        index=ov.index))
            continue
        if ov.index in refused:
            errors.append(refused[ov.index])
            continue
        try:
            old, value = application.apply(ov)
        except (_Refused, CoerceError) as refusal:
            errors.append(OverrideError(text=ov.text,
                                        key=ov.key,
                                        message=refusal.message,
                                        fix=_auto_hint(ov, refusal.fix),
                                        index=ov.index))
            continue
        except Exception as error:  # noqa: BLE001 - the config's own code refused (a setter, a property)
            errors.append(OverrideError(text=ov.text,
                                        key=ov.key,
                                        message=f"cannot be set ({type(error).__name__}: {error})",
                                        fix="set it in Python (a recipe or a transform of recipes/)",
                                        index=ov.index))
            continue
        changes.append((ov.key, old, value))
    if errors:
        raise OverrideErrors(sorted(errors, key=lambda e: e.index), applied=new)
    for key, old, value in changes:
        log.info("%s: %s -> %s (command-line override)", key, show(old), show(value))
    return new
