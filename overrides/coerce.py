"""Typed conversion: a parsed override value becomes the field's declared type, or is refused.

``optimizer.optimizer_offload_fraction=abc`` is an error here, not a string in a float field.
Types come from the dataclass annotations (resolved per defining class, so one unresolvable
forward reference elsewhere does not lose the others).
"""

from __future__ import annotations

import dataclasses
import decimal
import enum
import functools
import math
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

from mbridge_offload.facts.spelling import close_words

_NONE = type(None)


class CoerceError(ValueError):
    def __init__(self, message: str, fix: str = ""):
        super().__init__(message)
        self.message = message
        self.fix = fix


@functools.lru_cache(maxsize=None)
def field_types(cls: type) -> dict[str, Any]:
    """Resolved annotation of every dataclass field of ``cls`` (``Any`` where it cannot resolve)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # a forward reference somewhere in the MRO: resolve field by field
        hints = {}
        for klass in reversed(cls.__mro__):
            namespace = vars(sys.modules.get(klass.__module__, types.ModuleType("x")))
            for name, annotation in getattr(klass, "__annotations__", {}).items():
                if isinstance(annotation, str):
                    try:
                        annotation = eval(annotation, {**vars(typing), **namespace})  # noqa: S307
                    except Exception:
                        annotation = Any
                hints[name] = annotation
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls)}


def describe(annotation: Any) -> str:
    """A type as a user reads it: 'float', 'one of none, local', 'list of str', 'int or null'."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return "any value"
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin in (Union, types.UnionType):
        parts = [describe(a) for a in args if a is not _NONE]
        return " or ".join(parts) + (" or null" if _NONE in args else "")
    if origin is tuple and args and Ellipsis not in args:
        return "[" + ", ".join(describe(a) for a in args) + "]"
    if origin in (list, tuple, set, frozenset) or annotation in (list, tuple):
        inner = [a for a in args if a is not Ellipsis]
        return f"list of {describe(inner[0])}" if inner else "list"
    if origin is dict or annotation is dict:
        return "dict"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(m.name for m in annotation)
    if _is_dtype(annotation):
        return "dtype (float32, bfloat16, float16)"
    if isinstance(annotation, type):
        return {"bool": "bool (True/False)", "int": "int (a whole number)", "float": "float (a number)",
                "str": "str"}.get(annotation.__name__, annotation.__name__)
    return str(annotation)


def _is_dtype(annotation: Any) -> bool:
    return getattr(annotation, "__module__", "") == "torch" and getattr(annotation, "__name__", "") == "dtype"


_DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "float32": "float32", "bf16": "bfloat16",
                  "bfloat16": "bfloat16", "fp16": "float16", "half": "float16", "float16": "float16",
                  "fp8": "float8_e4m3fn", "uint8": "uint8", "int8": "int8"}


def _show(value: Any, raw: str | None) -> str:
    """The value as the user typed it (``raw``), else as parsed; a very long one shortened."""
    from overrides.errors import shown

    return repr(shown(raw, 120)) if raw is not None else shown(repr(value), 120)


def allows_null(annotation: Any) -> bool:
    """Whether the declared type takes null (``X | None``)."""
    return typing.get_origin(annotation) in (Union, types.UnionType) and _NONE in typing.get_args(annotation)


_LEADING_ZEROS = re.compile(r"[+-]?0[\d_]*\d[\d_]*(\.\d*)?([eE][+-]?\d+)?")
_BOOL_WORDS = {**dict.fromkeys(("yes", "y", "on", "1"), True), **dict.fromkeys(("no", "n", "off", "0"), False)}
_HEX = re.compile(r"[+-]?0[xXoObB][0-9a-fA-F_]+")
_NUMBER = re.compile(r"[+-]?(\d[\d_]*\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(inf|nan)", re.IGNORECASE)


def _number_hint(value: Any, key: str) -> str:
    """The fix for a number written as text: in hex (0x10), or in quotes ('5')."""
    if isinstance(value, str) and _HEX.fullmatch(value.strip()):
        try:
            return f"write it in decimal: {key}={int(value.strip().replace('_', ''), 0)}"
        except ValueError:
            return ""
    if isinstance(value, str) and _LEADING_ZEROS.fullmatch(value.strip()):
        plain = re.sub(r"^([+-]?)0+(?=\d)", r"\1", value.strip())
        return f"write it without the leading zeros: {key}={plain} (Hydra reads {value.strip()} as text)"
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        return f"write the number without quotes: {key}={value.strip()}"
    return ""


def _exact_int(value: float, raw: str | None) -> int:
    """A whole float as an int, exactly as typed where the text says more than the float holds
    (``1e30`` is 10**30, not 1000000000000000019884624838656)."""
    if raw is not None:
        try:
            exact = decimal.Decimal(raw.strip().replace("_", ""))
            if exact.is_finite() and exact == exact.to_integral_value():
                return int(exact)
        except (decimal.InvalidOperation, ValueError):
            pass
    return int(value)


def coerce(value: Any, annotation: Any, raw: str | None = None, current: Any = None, key: str = "key") -> Any:
    """``value`` (as Hydra parsed it; ``raw`` is its text) converted to ``annotation`` or CoerceError, whose
    fix names ``key``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)

    if annotation is Any or annotation is object:
        # Unresolvable annotation: keep the type of the value already there, when there is one.
        if current is not None and type(current) in (bool, int, float, str):
            return coerce(value, type(current), raw, key=key)
        return value

    if origin in (Union, types.UnionType):
        if value is None:
            if _NONE in args:
                return None
            raise CoerceError(f"expects {describe(annotation)}, got null (this field cannot be null)",
                              f"{key}=<{describe(annotation)}>")
        failures = []
        # Literals first, then the type Hydra parsed (1 stays an int in ``str | int``), then the rest.
        options = [a for a in args if a is not _NONE]
        options.sort(key=lambda a: (typing.get_origin(a) is not Literal, a is not type(value)))
        for option in options:
            try:
                return coerce(value, option, raw, current, key)
            except CoerceError as error:
                failures.append(error)
        or_null = f" (or {key}=null for none)" if _NONE in args else ""
        if len(failures) == 1:  # Optional[X]: X's own reason says more
            message = failures[0].message
            if _NONE in args and message.startswith("expects ") and "null" not in message:
                message = message.replace(", got ", " or null, got ", 1)
            fix = failures[0].fix or f"{key}=<{describe(options[0])}>"
            raise CoerceError(message, fix if or_null.strip() in fix else fix + or_null)
        raise CoerceError(f"expects {describe(annotation)}, got {_show(value, raw)}",
                          next((f.fix for f in failures if f.fix and not f.fix.startswith(f"{key}=<")),
                               f"{key}=<{describe(annotation)}>"))

    if value is None:
        raise CoerceError(f"expects {describe(annotation)}, got null (this field cannot be null)",
                          f"{key}=<{describe(annotation)}>")

    if origin is Literal:
        text = raw if raw is not None else value
        for choice in args:
            if choice == value or (isinstance(choice, str) and str(text) == choice):
                return choice
        close = close_words(str(text), [str(a) for a in args])
        raise CoerceError(f"expects one of {', '.join(map(str, args))}, got {_show(value, raw)}",
                          f"did you mean {key}={close[0]}?" if close else
                          f"{key}=<one of {', '.join(map(str, args))}>")

    if annotation is bool:
        if isinstance(value, bool):
            return value
        meant = _BOOL_WORDS.get(str(raw if raw is not None else value).strip().lower())
        if meant is not None:  # YAML 1.1 / OmegaConf words for a bool: Hydra's grammar reads them as text or a number
            raise CoerceError(f"expects True or False, got {_show(value, raw)} (a bool is written True or False)",
                              f"{key}={meant}")
        raise CoerceError(f"expects True or False, got {_show(value, raw)}", f"{key}=True or {key}=False")

    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return _exact_int(value, raw)
        if isinstance(value, float) and math.isfinite(value):
            near = sorted({math.floor(value), math.ceil(value)} - {0} or {1})
            fix = " or ".join(f"{key}={n}" for n in near)
        else:
            fix = _number_hint(value, key) or f"{key}=<a whole number>"
        raise CoerceError(f"expects an int (a whole number), got {_show(value, raw)}", fix)

    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if isinstance(value, float) and math.isnan(value):
                raise CoerceError("expects a number, got nan", f"{key}=<a number>")
            typed = (raw or "").strip().lower().lstrip("+-")
            if isinstance(value, float) and math.isinf(value) and typed not in ("inf", "infinity"):
                raise CoerceError(f"{_show(value, raw)} is beyond the largest float (about 1.8e308): it would be read "
                                  "as infinity", f"{key}={'-' if value < 0 else ''}inf if infinity is meant, else a smaller number")
            if value == 0 and re.search(r"[1-9]", typed.split("e")[0]):
                raise CoerceError(f"{_show(value, raw)} is below the smallest float (about 5e-324): it would be read "
                                  "as 0", f"{key}=0 if zero is meant, else a larger number")
            return float(value)
        raise CoerceError(f"expects a float (a number), got {_show(value, raw)}",
                          _number_hint(value, key) or f"{key}=<a number, e.g. 0.5 or 1e-4>")

    if annotation is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float, bool)) and raw is not None:
            return raw  # e.g. tokenizer_model=123: the text as typed
        raise CoerceError(f"expects a str, got {_show(value, raw)}",
                          f"quote it to make it text: {key}='...'")

    if annotation is Path or annotation is typing.Optional[Path]:
        if isinstance(value, str):
            return Path(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and raw is not None:
            return Path(raw)
        raise CoerceError(f"expects a path, got {_show(value, raw)}", f"{key}=/a/path")

    if _is_dtype(annotation):
        import torch

        text = str(raw if raw is not None else value).strip()
        name = _DTYPE_ALIASES.get(text.removeprefix("torch.").lower())
        if name is not None and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        close = close_words(text.removeprefix("torch."), _DTYPE_ALIASES)
        raise CoerceError(f"expects a dtype (float32, bfloat16, float16), got {_show(value, raw)}",
                          f"did you mean {key}={close[0]}?" if close else f"{key}=bf16, {key}=fp16 or {key}=fp32")

    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        text = str(raw if raw is not None else value).removeprefix(annotation.__name__ + ".")
        for member in annotation:
            if text in (member.name, str(member.value)) or value == member.value:
                return member
        close = close_words(text, [m.name for m in annotation])
        raise CoerceError(f"expects {describe(annotation)}, got {_show(value, raw)}",
                          f"did you mean {key}={close[0]}?" if close else
                          f"{key}=<{describe(annotation)}>")

    if origin in (list, tuple, set, frozenset, typing.Sequence) or annotation in (list, tuple):
        if not isinstance(value, list):
            raise CoerceError(f"expects {describe(annotation)} written as [a,b], got {_show(value, raw)}",
                              f"write a list: {key}=[a,b] (quote the whole override in a shell)")
        if origin is tuple and args and Ellipsis not in args:  # fixed positions, e.g. (paths, weights)
            if len(value) != len(args):
                raise CoerceError(f"expects {describe(annotation)} ({len(args)} items), got {len(value)} items",
                                  f"{key}=[{', '.join('<' + describe(a) + '>' for a in args)}]")
            return tuple(_item(v, a, i, len(value), key) for i, (v, a) in enumerate(zip(value, args)))
        inner = [a for a in args if a is not Ellipsis]
        items = [_item(v, inner[0], i, len(value), key) for i, v in enumerate(value)] if inner else list(value)
        if origin in (tuple,) or annotation is tuple:
            return tuple(items)
        if origin in (set, frozenset):
            return origin(items)
        return items

    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise CoerceError(f"expects a dict written as {{a:1}}, got {_show(value, raw)}", f"{key}={{name:value}}")
        if len(args) == 2:
            return {coerce(k, args[0], None, key=key): coerce(v, args[1], None, key=f"{key}.{k}")
                    for k, v in value.items()}
        return dict(value)

    if origin is typing.Callable or annotation is typing.Callable or origin is type(print):
        raise CoerceError("is a function and cannot be set from the command line",
                          "set it in Python (a recipe or a transform of recipes/)")
    if dataclasses.is_dataclass(annotation):
        raise CoerceError(f"is a {annotation.__name__} section: set its fields one by one",
                          f"{key}.<field>=<value>, or {key}=null to remove it where it may be null")
    if origin is not None and "Callable" in str(origin):
        raise CoerceError("is a function and cannot be set from the command line",
                          "set it in Python (a recipe or a transform of recipes/)")
    if isinstance(annotation, type):
        if isinstance(value, annotation):
            return value
        raise CoerceError(f"expects {describe(annotation)}, got {_show(value, raw)}",
                          "set it in Python (a recipe or a transform of recipes/)")
    return value


def _without_null(annotation: Any) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not _NONE]
    return args[0] if allows_null(annotation) and len(args) == 1 else annotation


def _item(value: Any, annotation: Any, index: int, count: int, key: str) -> Any:
    """One item of a list, its refusal saying which item (``[core_attn,[x]]``: item 2)."""
    try:
        return coerce(value, annotation, None, key=key)
    except CoerceError as error:
        fix = error.fix
        item_is_a_collection = typing.get_origin(_without_null(annotation)) in (list, tuple, dict)
        if annotation is str and isinstance(value, (int, float, bool)):
            fix = f"quote the item to make it text: '{value}'"
        elif isinstance(value, (list, dict)) and not item_is_a_collection:
            fix = f"a list of {describe(annotation)} is written flat: {key}=[a,b]"
        elif isinstance(value, (list, dict)):
            pass  # the inner list's own refusal says which of its items
        else:
            fix = f"item {index + 1}: " + fix.replace(f"{key}=", "", 1)
        raise CoerceError(f"item {index + 1} of {count} ({_show(value, None)}): {error.message}", fix) from None
