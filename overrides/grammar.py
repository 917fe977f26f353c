"""Hydra override grammar: ``key=value``, ``+key=value``, ``++key=value``, ``~key[=value]``,
lists ``[a,b]``, dicts ``{a:1}``, quoting, ``null``; sweeps ``a=1,2`` are recognised as sweeps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from overrides.errors import OverrideError

CHANGE, ADD, FORCE_ADD, DELETE = "change", "add", "force_add", "delete"


def key_of(text: str) -> str:
    """The dotted key of an override as typed (``+a.b=1`` -> ``a.b``), without parsing its value."""
    return text.lstrip("+~").split("=", 1)[0]


@dataclass(frozen=True)
class ParsedOverride:
    text: str
    key: str
    op: str
    value: Any  # Hydra's parsed value (int, float, bool, str, None, list, dict); sweeps: list of values
    raw: str | None  # the value as typed (for str fields given something that parses as a number)
    has_value: bool
    is_sweep: bool = False


def parse(texts: list[str]) -> tuple[list[ParsedOverride], list[OverrideError]]:
    """Parse each override on its own, so every malformed one is reported."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    parsed, errors = [], []
    for text in texts:
        key_guess = key_of(text)
        if "=" not in text and not text.startswith("~"):
            errors.append(OverrideError(text, key_guess, "an override needs the form key=value",
                                        f"{key_guess}=<value>"))
            continue
        try:
            ov = parser.parse_override(text)
        except HydraException as error:
            reason = str(error).strip().splitlines()[0]
            errors.append(OverrideError(text, key_guess, f"not valid override syntax ({reason})",
                                        "quote values with spaces or special characters: key='a value'"))
            continue
        if ov.package is not None:
            errors.append(OverrideError(text, ov.key_or_group, "package overrides (key@pkg) are not supported"))
            continue
        op = {OverrideType.CHANGE: CHANGE, OverrideType.ADD: ADD,
              OverrideType.FORCE_ADD: FORCE_ADD, OverrideType.DEL: DELETE}[ov.type]
        is_sweep = ov.is_sweep_override()
        has_value = ov.value() is not None or (ov.type != OverrideType.DEL and "=" in text)
        if is_sweep:
            value = list(ov.sweep_string_iterator()) if hasattr(ov, "sweep_string_iterator") else None
            raw = None
        else:
            value = ov.value()
            raw = ov.get_value_element_as_str() if has_value and not isinstance(value, (list, dict)) else None
        parsed.append(ParsedOverride(text, ov.key_or_group, op, value, raw, has_value, is_sweep))
    return parsed, errors
