"""Hydra override grammar: ``key=value``, ``+key=value``, ``++key=value``, ``~key[=value]``,
lists ``[a,b]``, dicts ``{a:1}``, quoting, ``null``; sweeps ``a=1,2`` are recognised as sweeps.

Before Hydra's parser sees an override, the mistakes its own messages explain badly are refused here in
words that name the fix: an empty override or key, spaces around the key, a control character, a key
that is not dotted names, two ``=``, an empty value (``key=`` is what ``key=$UNSET_VARIABLE`` becomes in
a shell), ``key=~``, an interpolation ``${...}`` (nothing resolves it here) and ``shuffle()`` (a random
order)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

from overrides.errors import OverrideError

CHANGE, ADD, FORCE_ADD, DELETE = "change", "add", "force_add", "delete"

EXAMPLE = "optimizer.optimizer_offload_fraction=0.5"
# A key is dotted names: letters, digits, '_' and '-' (dict entries such as env_vars.NCCL_DEBUG included).
_KEY_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*|[0-9]+")
_INTERPOLATION = re.compile(r"(?<!\\)\$\{")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SHUFFLE = re.compile(r"^\s*shuffle\s*\(")
_SEVERAL = re.compile(r"\s[+~]{0,2}[A-Za-z_][\w.\-]*=")  # "a=1 b=2": two overrides in one argument


def key_of(text: str) -> str:
    """The dotted key of an override as typed (``+a.b=1`` -> ``a.b``), without parsing its value."""
    return text.lstrip("+~").split("=", 1)[0]


def given_keys(texts: Iterable[str]) -> frozenset[str]:
    """The dotted keys a command line gives a value (``+a.b=1`` -> ``a.b``): validation's ``Context.given_keys``, for
    the rules that must tell a value asked for from the same value left at its default (the final config cannot). A
    reset (``~key``) sets the default back: it asks for no value, and is left out."""
    return frozenset(key_of(text) for text in texts if isinstance(text, str) and not text.startswith("~"))


def value_text_of(text: str) -> str | None:
    """The value of an override as typed (after the first ``=``, outer spaces removed); None without ``=``."""
    if "=" not in text:
        return None
    return text.split("=", 1)[1].strip()


@dataclass(frozen=True)
class ParsedOverride:
    text: str
    key: str
    op: str
    value: Any  # Hydra's parsed value (int, float, bool, str, None, list, dict); sweeps: list of values
    raw: str | None  # the value as typed (for str fields given something that parses as a number)
    has_value: bool
    is_sweep: bool = False
    index: int = 0  # its position in the command (errors are listed in the command's order)
    quoted: bool = False  # the value was written in quotes ('None' is the text, None unquoted is null)


_PREFIX = {CHANGE: "", ADD: "+", FORCE_ADD: "++", DELETE: "~"}


def _op_and_key(text: str) -> tuple[str, str]:
    if text.startswith("++"):
        return FORCE_ADD, text[2:]
    if text.startswith("+"):
        return ADD, text[1:]
    if text.startswith("~"):
        return DELETE, text[1:]
    return CHANGE, text


def _quote(value: str) -> str:
    """``value`` in single quotes as Hydra reads them: a backslash escapes only a quote, so each quote gets one and
    any backslashes right before a quote (the closing one included) are doubled; other backslashes stay as they are."""
    escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
    escaped = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped)
    return "'" + escaped + "'"


# what Hydra reads unquoted as the same text: names and paths without its special characters, and nothing it reads
# as a number, a bool or null
_PLAIN_TEXT = re.compile(r"[A-Za-z_/.][A-Za-z0-9_/.\-]*")
_NOT_TEXT = re.compile(r"(?i)(true|false|null|none|inf|nan|[+-]?[0-9._]+(e[+-]?[0-9]+)?)")


def text_override(key: str, value: str) -> str:
    """``key=value`` for a text value (a folder, a name) as one override: quoted where Hydra would read the bare
    text as something else (a sweep at a ``,``, a list, an interpolation, a number), bare where it would not."""
    plain = _PLAIN_TEXT.fullmatch(value) and not _NOT_TEXT.fullmatch(value)
    return f"{key}={value}" if plain else f"{key}={_quote(value)}"


def _printable(text: str) -> str:
    return text.encode("unicode_escape").decode("ascii")


def shape_error(text: str, index: int = 0) -> OverrideError | None:
    """The refusal of an override whose shape is wrong before any value is read; None when it is fine."""
    def refuse(key: str, message: str, fix: str) -> OverrideError:
        return OverrideError(text=text,
                             key=key,
                             message=message,
                             fix=fix,
                             index=index)

    if not text.strip():
        return refuse("", "empty override (nothing to set)",
                      f"write key=value, e.g. {EXAMPLE}, or drop the empty argument")
    control = _CONTROL.search(text)
    if control:
        cleaned = _CONTROL.sub("", text).strip()
        return refuse(_CONTROL.sub("", key_of(text)), f"contains a control character "
                      f"({_printable(control.group())} at position {control.start() + 1})",
                      f"retype it without it: {cleaned}" if cleaned else f"write key=value, e.g. {EXAMPLE}")
    op, rest = _op_and_key(text.lstrip())
    key, sep, value = rest.partition("=")
    if key != key.strip() or text != text.lstrip():
        fixed = _PREFIX[op] + key.strip() + (sep + value.strip() if sep else "")
        return refuse(key.strip(), "spaces around the key (an override is one word: key=value)",
                      f"write it without spaces: {fixed}")
    if op != DELETE and not sep:
        if not key:
            return refuse("", f"'{text}' has no key", f"write {text}key=value, e.g. {text}{EXAMPLE}")
        return refuse(key, "an override needs the form key=value",
                      f"{text}=<value>" if op == CHANGE else f"{text}=<value>, or ~{key} to reset it")
    if not key:
        return refuse("", "no key before '='" if sep else f"'{text}' has no key",
                      f"write key=value, e.g. {EXAMPLE}" + (" (no spaces around '=')" if sep else ""))
    if "@" in key:
        return None  # a package override: Hydra's parser reads it, apply refuses it with the key
    bad = next((part for part in key.split(".") if not _KEY_PART.fullmatch(part)), None)
    if bad is not None:
        if "/" in key:
            return refuse(key, "'/' does not separate the parts of a key here",
                          f"use '.': {text.replace('/', '.', key.count('/'))}")
        if bad == "":
            dotted = ".".join(p for p in key.split(".") if p)
            return refuse(key, "an empty part in the key (a dot at the start or end, or two dots)",
                          f"write {dotted}=..." if dotted else f"write key=value, e.g. {EXAMPLE}")
        return refuse(key, f"{bad!r} is not a key name (names are ASCII letters, digits, '_' and '-', "
                      "joined by '.')", "see --dry-run output for the keys of this recipe")
    if not sep:
        return None
    if value.startswith("="):
        rest_value = value.lstrip("=")
        if not rest_value:
            return refuse(key, "two '=' signs and no value",
                          f"give a value: {text[: len(text) - len(value) - 1]}=<value>")
        return refuse(key, "two '=' signs", f"write {text[: len(text) - len(value) - 1]}={rest_value}"
                      f" (or, if the value starts with '=', quote it: {key}={_quote(value)})")
    stripped = value.strip()
    if stripped == "":
        return refuse(key, "no value after '=' (an empty variable in a shell gives this too)",
                      f"give a value: {key}=<value>; {key}=null for none; {key}='' for an empty text")
    if stripped == "~":
        return refuse(key, "'~' is not a value here (YAML's null is written null; ~ before a key resets it)",
                      f"{key}=null to set it to none, or ~{key} to reset it to its default")
    if _SEVERAL.search(stripped) and stripped[:1] not in "'\"":
        return refuse(key, "several overrides in one argument",
                      "give each as its own argument: " + " ".join(text.split()))
    return None


def _has_interpolation(value: Any) -> bool:
    if isinstance(value, str):
        return bool(_INTERPOLATION.search(value))
    if isinstance(value, list):
        return any(_has_interpolation(v) for v in value)
    if isinstance(value, dict):
        return any(_has_interpolation(k) or _has_interpolation(v) for k, v in value.items())
    return False


def _syntax_fix(parser: Any, text: str) -> str:
    """A form of the override that parses: the value quoted (``key=a=b`` -> ``key='a=b'``), or its brackets or
    quote closed (``key=[a`` -> ``key=[a]``); else the general advice."""
    value = value_text_of(text)
    head = text[: len(text) - len(text.split("=", 1)[1])] if value is not None else text
    candidates = []
    if value and value[0] not in "'\"[{":
        candidates.append(("quote the value", head + _quote(value)))
    if value and value[0] in "[{":
        closing = "".join({"[": "]", "{": "}"}[c] for c in reversed(value) if c in "[{")
        missing = (value.count("[") - value.count("]")) + (value.count("{") - value.count("}"))
        if missing > 0:
            candidates.append(("close the brackets", head + value + closing[:missing]))
    if value and value[0] in "'\"" and value.count(value[0]) % 2:
        candidates.append(("close the quote", head + value + value[0]))
    for words, fixed in candidates:
        try:
            parser.parse_override(fixed)
            return f"{words}: {fixed}"
        except Exception:  # noqa: BLE001 - this form does not parse either: try the next
            continue
    return "quote values with spaces or special characters: key='a value'; lists are [a,b], dicts {a:1}"


def _split_by_spaces(texts: list[Any], index: int) -> int:
    """How many arguments from ``index`` on are one override that spaces around '=' split in a shell
    (``key = value``, ``key =value``, ``key= value``): 3 or 2, else 0."""
    def word(i: int) -> str | None:
        return texts[i] if i < len(texts) and isinstance(texts[i], str) else None

    first, second, third = word(index), word(index + 1), word(index + 2)
    if first is None or second is None or not first or first[0] == "~" or first.strip() != first:
        return 0
    names_a_key = "=" not in first and bool(_KEY_PART.match(first.lstrip("+")))
    if names_a_key and second == "=" and third and "=" not in third:
        return 3
    if names_a_key and len(second) > 1 and second[0] == "=" and "=" not in second[1:]:
        return 2
    if first.count("=") == 1 and first.endswith("=") and len(first) > 1 and second and "=" not in second \
            and second[0] not in "+~-":
        return 2
    return 0


def parse(texts: list[str]) -> tuple[list[ParsedOverride], list[OverrideError]]:
    """Parse each override on its own, so every malformed one is reported."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    parser = OverridesParser.create()
    parsed, errors = [], []
    skip = 0
    for index, text in enumerate(texts):
        if skip:
            skip -= 1
            continue
        split = _split_by_spaces(texts, index)
        if split:
            pieces = texts[index: index + split]
            joined = "".join(pieces)
            errors.append(OverrideError(text=" ".join(pieces),
                                        key=key_of(joined),
                                        message=f"spaces around '=' split this override into {split} arguments",
                                        fix=f"write it as one word: {joined}",
                                        index=index))
            skip = split - 1
            continue
        if not isinstance(text, str):
            errors.append(OverrideError(text=repr(text),
                                        key="",
                                        message=f"an override is text, got {type(text).__name__}",
                                        fix=f"give it as a string: 'key=value', e.g. '{EXAMPLE}'",
                                        index=index))
            continue
        shape = shape_error(text, index)
        if shape is not None:
            errors.append(shape)
            continue
        key_guess = key_of(text)
        try:
            ov = parser.parse_override(text)
        except Exception as error:  # noqa: BLE001 - HydraException, or anything its parser raises on odd input
            if not isinstance(error, RecursionError) and "maximum recursion depth" not in str(error):
                reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
                errors.append(OverrideError(text=text,
                                            key=key_guess,
                                            message=f"not valid override syntax ({reason})",
                                            fix=_syntax_fix(parser, text),
                                            index=index))
                continue
            errors.append(OverrideError(text=text,
                                        key=key_guess,
                                        message="nested too deeply to be read",
                                        fix="write fewer levels of [ ] or { } (a list of lists is [[a],[b]])",
                                        index=index))
            continue
        if ov.package is not None:
            errors.append(OverrideError(text=text,
                                        key=ov.key_or_group,
                                        message="package overrides (key@pkg) are not supported",
                                        fix=f"write the dotted key alone: {key_guess.split('@', 1)[0]}=...",
                                        index=index))
            continue
        op = {OverrideType.CHANGE: CHANGE, OverrideType.ADD: ADD,
              OverrideType.FORCE_ADD: FORCE_ADD, OverrideType.DEL: DELETE}[ov.type]
        value_text = value_text_of(text)
        has_value = ov.type != OverrideType.DEL or value_text is not None
        try:
            is_sweep = ov.is_sweep_override()
        except Exception:  # noqa: BLE001
            is_sweep = False
        if is_sweep:  # the values are not needed (a sweep is refused); interval() and glob() cannot list them
            parsed.append(ParsedOverride(text=text,
                                         key=ov.key_or_group,
                                         op=op,
                                         value=None,
                                         raw=None,
                                         has_value=has_value,
                                         is_sweep=True,
                                         index=index))
            continue
        value = ov.value()
        if _has_interpolation(value):
            errors.append(OverrideError(text=text,
                                        key=ov.key_or_group,
                                        message="interpolations (${...}) are not resolved here",
                                        fix=f"give the value itself: {ov.key_or_group}=<value> "
                                            "(a shell expands $NAME before the command sees it)",
                                        index=index))
            continue
        if value_text is not None and _SHUFFLE.match(value_text):
            errors.append(OverrideError(text=text,
                                        key=ov.key_or_group,
                                        message="shuffle() gives a random order: one run takes one value",
                                        fix=f"write the list in the order you want: {ov.key_or_group}=[a,b]",
                                        index=index))
            continue
        quoted = bool(value_text) and value_text[0] in "'\""
        if isinstance(value, str) or not has_value or isinstance(value, (list, dict)) or value is None:
            raw = value if isinstance(value, str) else None
        elif value_text is not None and "(" not in value_text:
            raw = value_text  # the text as typed: 1e-4 stays 1e-4 in a str field, 007 stays 007
        else:
            raw = str(value)
        parsed.append(ParsedOverride(text=text,
                                     key=ov.key_or_group,
                                     op=op,
                                     value=value,
                                     raw=raw,
                                     has_value=has_value,
                                     is_sweep=False,
                                     index=index,
                                     quoted=quoted))
    return parsed, errors
