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
from typing import Any, Iterable, Iterator

from mbridge_offload.facts.spelling import ascii_lookalike, describe_char
from overrides.errors import OverrideError

CHANGE, ADD, FORCE_ADD, DELETE = "change", "add", "force_add", "delete"

EXAMPLE = "optimizer.optimizer_offload_fraction=0.5"
# A key is dotted names: letters, digits, '_' and '-' (dict entries such as env_vars.NCCL_DEBUG included).
_KEY_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*|[0-9]+")
_INTERPOLATION = re.compile(r"(?<!\\)\$\{")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SHUFFLE = re.compile(r"^\s*shuffle\s*\(")
_MOST_DIGITS = 4300  # Python reads no longer whole number from text (sys.int_info.default_max_str_digits)
_DIGITS = re.compile(r"\d{%d,}" % (_MOST_DIGITS + 1))
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


def _outside_quotes(text: str, quote_anywhere: bool = False, escapes_outside: bool = False) -> Iterator[int]:
    """The positions of ``text`` outside ASCII quotes (inside them, any character is the text's own; a backslash
    there escapes the next character). ``quote_anywhere``: any quote opens a quoted part, not only one at the start
    of a value or item (after ``= [ { , :`` or a space). ``escapes_outside``: a backslash outside quotes escapes the
    next character too, as in Hydra's unquoted values (``a\\:b`` is the text ``a:b``): neither is given."""
    quote, escaped = None, False
    for i, char in enumerate(text):
        if escaped:
            escaped = False
            continue
        if quote is not None:
            if char == "\\":
                escaped = True
            elif char == quote:
                quote = None
            continue
        if char in "'\"" and (quote_anywhere or i == 0 or text[i - 1] in "=[{,: "):
            quote = char
            continue
        if char == "\\" and escapes_outside:
            escaped = True
            continue
        yield i


def _lookalikes(text: str) -> tuple[list[tuple[int, str, str]], str]:
    """The characters outside quotes that look like ASCII ones but are not ((position, character, its ASCII)), and
    ``text`` with each replaced."""
    found = []
    key_end = next((i for i, c in enumerate(text) if c == "=" or ascii_lookalike(c) == "="), len(text))
    for i in _outside_quotes(text):
        if not text[i].isascii():
            ascii_text = ascii_lookalike(text[i])
            if ascii_text is not None:  # a space inside a key is never meant: the look-alike goes
                found.append((i, text[i], "" if ascii_text == " " and i < key_end else ascii_text))
    fixed = list(text)
    for i, _, ascii_text in found:
        fixed[i] = ascii_text
    return found, "".join(fixed)


def _lookalike_error(text: str, index: int, key: str, where: str) -> OverrideError | None:
    """A character outside quotes that looks like an ASCII one (an en dash for '-', typographic quotes, a no-break
    space, a Cyrillic letter): named, with the override retyped in ASCII."""
    found, fixed = _lookalikes(text)
    if not found:
        return None
    first = found[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    drawn_as = ascii_lookalike(first[1]) or ""
    drawn = f"looks like {drawn_as!r} but is not it" if drawn_as.strip() else (
        "looks like a space but is not one" if drawn_as else "is invisible")
    value = value_text_of(text)
    keep = (f"; to keep the characters as typed, quote the value: {key_of(text) if text[:1] not in '+~' else text.split('=', 1)[0]}="
            f"{_quote(value)}" if where == "value" and value and first[2].strip() and first[2] not in "'\"" else "")
    if "=" in fixed:  # a space that was not one, next to '=' or at an end: dropped
        head, _, rest = fixed.partition("=")
        fixed = head.strip() + "=" + rest.strip()
    return OverrideError(text=text,
                         key=key_of(fixed) if where == "key" else key,
                         message=f"{describe_char(first[1])} at position {first[0] + 1} {drawn}{more} (text pasted "
                                 "from a document, chat or web page brings such characters)",
                         fix=f"retype it in ASCII: {fixed.strip()}{keep}",
                         index=index)


_PREFIX_WORDS = "'+key=value' adds a key, '++key=value' adds or changes one, '~key' resets one to its default"


def _prefix_error(text: str, key: str, sep: str, value: str, refuse: Any) -> OverrideError | None:
    """A key that still starts with '+', '~' or '-' once the override's own prefix is read (``+++a=1``, ``~~a``,
    ``+~a``, ``--a=1``): the prefix is not one Hydra knows."""
    if not key or key[0] not in "+~-":
        return None
    name = key.lstrip("+~-")
    head = text[: len(text) - len(key) - len(sep + value)]
    typed = head + key[: len(key) - len(name)]
    body = name + (sep + value if sep else "")
    if set(typed) <= {"-"}:
        from overrides.short_flags import SHORT_FLAGS

        flag = next((f for f in SHORT_FLAGS if typed + name in f.flags), None)
        if flag is not None:
            return refuse(name, f"{typed + name} is an option of the command, not an override",
                          f"{typed + name} {value or '<value>'}  (a space, not '='), or "
                          + " ".join(f"{k}={value or '<value>'}" for k in flag.keys))
        fix = (f"write it without dashes: {body}" if sep else f"write {name}=<value>") + \
              " (an override is key=value; the options with dashes are the command's own, see --help)"
        return refuse(name, f"{typed!r} before the key: an override takes no dashes", fix)
    if "~" in typed and "+" in typed:
        return refuse(name, f"{typed!r} mixes '+' and '~' ({_PREFIX_WORDS})",
                      f"~{name} to reset it, or ++{name}=<value> to set it" if not sep else
                      f"~{name} to reset it, or ++{body} to set it")
    if "~" in typed:
        return refuse(name, f"{typed!r} is not a prefix ({_PREFIX_WORDS})", f"~{body}")
    return refuse(name, f"{typed!r} is not a prefix ({_PREFIX_WORDS})",
                  f"++{body}" if sep else f"++{name}=<value>")


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
    if not key_of(text).isascii():  # the key, before the first '='; a look-alike '=' (＝) leaves all of it key
        lookalike = _lookalike_error(text, index, "", "key")
        if lookalike is not None:
            return lookalike
    op, rest = _op_and_key(text.lstrip())
    key, sep, value = rest.partition("=")
    prefix = _prefix_error(text.lstrip(), key, sep, value, refuse) if text == text.lstrip() else None
    if prefix is not None:
        return prefix
    if not sep and ":" in key and _KEY_PART.fullmatch(key.split(":", 1)[0].split(".")[-1] or "-"):
        name, _, typed_value = key.partition(":")
        return refuse(name, "':' does not set a value here (that is YAML; an override is key=value)",
                      f"write {_PREFIX[op]}{name}={typed_value.strip() or '<value>'}")
    if not sep and key and any(part == "" for part in key.split(".")):
        dotted = ".".join(p for p in key.split(".") if p)
        return refuse(key, "an empty part in the key (a dot at the start or end, or two dots), and no '=value'",
                      f"write {_PREFIX[op]}{dotted}=<value>" if dotted else f"write key=value, e.g. {EXAMPLE}")
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
        odd = next((c for c in bad if not (c.isascii() and (c.isalnum() or c in "_-"))), None)
        return refuse(key, f"{bad!r} is not a key name (names are ASCII letters, digits, '_' and '-', "
                      "joined by '.')" + (f": {describe_char(odd)} is none of them" if odd else ""),
                      "see --dry-run output for the keys of this recipe")
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
    digits = _DIGITS.search(stripped) if stripped[:1] not in "'\"" else None
    if digits:
        return refuse(key, f"a number of {len(digits.group())} digits (more than {_MOST_DIGITS}: no setting takes one "
                      "this long; pasted by mistake?)", f"give the value itself: {key}=<value>")
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


def _unescaped(value: Any) -> Any:
    """``\\${x}`` is Hydra's (OmegaConf's) way to write the text ``${x}``: the text, as OmegaConf reads it."""
    if isinstance(value, str):
        return value.replace("\\${", "${")
    if isinstance(value, list):
        return [_unescaped(v) for v in value]
    if isinstance(value, dict):
        return {k: _unescaped(v) for k, v in value.items()}
    return value


def _duplicate_dict_key(value_text: str) -> str | None:
    """A key a dict of the value gives twice (``{A:1,A:2}``; Hydra's parser keeps the last silently), else None."""
    stack: list[set[str] | None] = []  # one frame per open bracket: a dict's keys so far, None for a list
    start = None
    for i in _outside_quotes(value_text, quote_anywhere=True, escapes_outside=True):
        char = value_text[i]
        if char in "[{":
            stack.append(set() if char == "{" else None)
            start = i + 1 if char == "{" else None
        elif char in "]}":
            if stack:
                stack.pop()
            start = None
        elif char == "," and stack and stack[-1] is not None:
            start = i + 1
        elif char == ":" and stack and stack[-1] is not None and start is not None:
            name = value_text[start:i].strip().strip("'\"")
            if name in stack[-1]:
                return name
            stack[-1].add(name)
            start = None
    return None


def _doubled_quote_fix(parser: Any, head: str, value: str | None) -> str | None:
    """A quote inside a quoted value written doubled, as SQL and YAML escape it (``key='it''s'``): Hydra reads two
    quoted values there. The value meant, in the other quotes and with the quote escaped by a backslash (the forms
    that parse), else None."""
    if not value or value[0] not in "'\"":
        return None
    quote = value[0]
    body = value[1:-1] if len(value) > 1 and value.endswith(quote) else value[1:]
    if quote * 2 not in body:
        return None
    meant = body.replace(quote * 2, quote)
    other = "'" if quote == '"' else '"'
    forms = [head + other + meant + other if other not in meant else None, head + _quote(meant)]
    working = []
    for form in dict.fromkeys(f for f in forms if f is not None):
        try:
            if parser.parse_override(form).value() == meant:  # the text meant, as Hydra reads it
                working.append(form)
        except Exception:  # noqa: BLE001 - this form does not parse: the other may
            continue
    if not working:
        return None
    return (f"a quote inside a quoted value is escaped with a backslash, not doubled (Hydra reads {quote}{quote} as "
            f"the end of one quoted text and the start of another): " + "  or  ".join(working))


def _syntax_fix(parser: Any, text: str) -> str:
    """A form of the override that parses: the value quoted (``key=a=b`` -> ``key='a=b'``), or its brackets or
    quote closed (``key=[a`` -> ``key=[a]``); else the general advice."""
    value = value_text_of(text)
    head = text[: len(text) - len(text.split("=", 1)[1])] if value is not None else text
    doubled = _doubled_quote_fix(parser, head, value)
    if doubled:
        return doubled
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
    if value and value[0] == "[":
        flat = re.sub(r"\[\s*,|,\s*(?=[,\]])", lambda m: "[" if m.group().startswith("[") else "", value)
        if flat != value:
            candidates.append(("drop the empty item (a ',' at the start or end of the list, or two in a row)",
                               head + flat))
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
                lookalike = _lookalike_error(text, index, key_guess, "value")
                if lookalike is not None:
                    errors.append(lookalike)
                    continue
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
        interpolated = _has_interpolation(value)  # an escaped one (\\${x}) is text, unescaped below
        value = _unescaped(value)
        duplicate = _duplicate_dict_key(value_text or "")
        if duplicate is not None:
            errors.append(OverrideError(text=text,
                                        key=ov.key_or_group,
                                        message=f"the dict gives {duplicate!r} twice (Hydra keeps the last; the "
                                                "result would depend on the order)",
                                        fix=f"give {duplicate!r} once in {ov.key_or_group}={{...}}",
                                        index=index))
            continue
        if interpolated:
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
