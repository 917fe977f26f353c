"""What every command does first: parse its line, refuse what it cannot use in one line with exit 2 (an
unknown recipe with suggestions, a bad flag, a file it cannot read, a folder it cannot write), and only
then import anything heavy. Nothing here imports Megatron."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from recipes import registry

EXIT_INVALID = 2


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose refusals are one line (``prog: error: ...``) and exit 2; --help is unchanged."""

    def error(self, message: str) -> NoReturn:
        message = " ".join(str(message).split())
        self.exit(EXIT_INVALID, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parse_command(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = parser.parse_intermixed_args(argv)
    registry.get_or_exit(parser, args.recipe)
    return args


def _whole_number_at_least(minimum: int, unit: str, wanted: str):
    """An argparse type: a whole number of ``unit`` (e.g. 'GPU') >= ``minimum``, with errors that say which."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expects a whole number of {unit}s, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expects {wanted}, got {value}")
        return value

    parse.__name__ = f"{unit} count"
    return parse


def at_least_one(unit: str):
    """An argparse type: a whole number >= 1 of ``unit``."""
    return _whole_number_at_least(1, unit, f"at least 1 {unit}")


def not_negative(unit: str):
    """An argparse type: a whole number >= 0 of ``unit``."""
    return _whole_number_at_least(0, unit, f"0 or more {unit}s")


def positive_seconds(text: str) -> float:
    """An argparse type: a time limit in seconds, > 0 and finite."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects seconds (a number), got {text!r}") from None
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"expects a number of seconds above 0, got {text!r}")
    return value


def readable_file(text: str) -> Path:
    """An argparse type: a file that exists and can be read."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    try:
        with path.open("rb") as handle:
            handle.read(1)
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {error.strerror or error}") from None
    return path


def readable_dir(text: str) -> Path:
    """An argparse type: a folder that exists and can be listed."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no such folder: {text}")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    try:
        next(iter(path.iterdir()), None)
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {error.strerror or error}") from None
    return path


def read_json(parser: argparse.ArgumentParser, flag: str, path: Path) -> Any:
    """The JSON in ``path``, or the command's one-line refusal naming ``flag``."""
    try:
        return json.loads(path.read_text())
    except OSError as error:
        parser.error(f"{flag} {path}: cannot read it ({error.strerror or error})")
    except (ValueError, UnicodeDecodeError) as error:
        parser.error(f"{flag} {path}: not JSON ({error})")


def _read_only_mount(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def unwritable_reason(path: Path, kind: str = "folder") -> str | None:
    """Why ``path`` (a folder, or a file with ``kind="file"``) cannot be written, creating what is missing;
    None when it can. Nothing is created to find out."""
    path = Path(path)
    if path.exists():
        if kind == "folder" and not path.is_dir():
            return f"{path} is a file, not a folder"
        if kind == "file" and path.is_dir():
            return f"{path} is a folder, not a file"
        target = path if kind == "folder" else path.parent
        if kind == "file" and not os.access(path, os.W_OK):
            return f"{path} cannot be written (no permission)"
    else:
        target = path.parent
    # the nearest existing folder above is where the missing parts would be created
    while not target.exists():
        if target.parent == target:
            break
        target = target.parent
    if target.exists() and not target.is_dir():
        return f"{path}: {target} is a file, not a folder"
    if not os.access(target, os.W_OK | os.X_OK):
        return f"{path} cannot be created or written: {target} is not writable"
    if _read_only_mount(target):
        return f"{path} cannot be written: {target} is on a read-only file system"
    return None


def check_writable(parser: argparse.ArgumentParser, flag: str, path: Path | None, kind: str = "folder") -> None:
    """Refuse (exit 2, one line) a ``flag`` folder or file the command could not write."""
    if path is None:
        return
    reason = unwritable_reason(path, kind)
    if reason:
        parser.error(f"{flag}: {reason}")


def make_dir(parser: argparse.ArgumentParser, flag: str, path: Path) -> None:
    """Create the ``flag`` folder, or refuse in one line when the system says no."""
    check_writable(parser, flag, path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        parser.error(f"{flag} {path}: cannot create it ({error.strerror or error})")


def split_fraction_overrides(parser: argparse.ArgumentParser, overrides: list[str], owned_fix: str | None = None):
    """bench/sweep's ``split_overrides`` (a multirun fraction taken out, keys the command owns refused with
    ``owned_fix``, by default the sweep's), with its refusals as the command's one-line errors."""
    from mbridge_offload.bench.sweep import FRACTION_KEY, SWEEP_OWNED_FIX, split_overrides

    try:
        return split_overrides(list(overrides), owned_fix or SWEEP_OWNED_FIX)
    except argparse.ArgumentTypeError as error:
        parser.error(f"{FRACTION_KEY}: {error}")
    except SystemExit as stop:
        parser.error(str(stop.code).split(": ", 1)[-1] if isinstance(stop.code, str) else "invalid overrides")


def refuse_bad_overrides(parser: argparse.ArgumentParser, recipe_name: str, overrides: list[str]) -> None:
    """Before any training starts: overrides that cannot be applied to the recipe are refused (exit 2, the
    override errors), from the cache of the recipe (mbridge_offload/fast_check), else by building the recipe
    here once; each run's run_recipe.py validates the rest."""
    from mbridge_offload import fast_check

    message = fast_check.override_errors(registry.get(recipe_name), overrides, build=True)
    if message:
        print(f"{parser.prog}: error: " + message, file=sys.stderr)
        parser.exit(EXIT_INVALID)


def parse_single_fraction_command(parser: argparse.ArgumentParser, argv: list[str] | None,
                                  multirun_error: str) -> tuple[argparse.Namespace, list[str]]:
    """The start of a check that runs one recipe with overrides into --out (check_resume, check_auto): the
    arguments, the overrides (a multirun fraction refused with ``multirun_error``, bad overrides refused before
    anything starts), and --out made. Refusals are one line, exit 2."""
    args = parse_command(parser, argv)
    check_writable(parser, "--out", args.out)
    multirun, overrides = split_fraction_overrides(parser, args.overrides, owned_fix=multirun_error)
    if multirun:
        parser.error(multirun_error)
    refuse_bad_overrides(parser, args.recipe, overrides)
    make_dir(parser, "--out", args.out)
    return args, overrides


def refuse(message: str) -> int:
    """Print a refusal the command found after parsing (one line) and return exit 2."""
    print(message, file=sys.stderr)
    return EXIT_INVALID
