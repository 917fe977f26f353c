"""What every command does first: parse its line, refuse what it cannot use in one line with exit 2 (an
unknown recipe with suggestions, a bad flag, a file it cannot read, a folder it cannot write), and only
then import anything heavy. Nothing here imports Megatron.

A command with a JSON output mode (``--json``) refuses in JSON too: besides the words on stderr, stdout gets one
object, ``{"ok": false, "refused": true, "error": "...", "problems": [...]}`` (``problem_json``'s fields, as the
command's own output has them; empty where the refusal is no list of problems), so that a program reading stdout
gets the reason instead of nothing. Every refusal of such a command goes through ``RefusalParser``: its
``error`` and ``exit`` (argparse's errors, parse_intermixed_args' included) and its ``refuse`` (what the
command finds after parsing).

Every command's parser refuses, besides argparse's own errors, what argparse would take with another meaning: an
option given twice (argparse keeps the last without a word), an empty value (``--out ''`` would be the current
folder), a count beyond a C int, an output folder or file inside this repository where git does not ignore it, and a
plugin environment variable (``MBRIDGE_OFFLOAD_*``) whose value would be read otherwise than meant, or whose name
is a misspelling of one."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Mapping, NoReturn, Sequence

from mbridge_offload.facts.offload_engine import (COPY_PAUSE_ENV, COPY_WINDOW_ENV, DELAYED_COPY_START_ENV, ENGINE_ENV,
                                                  FETCH_AHEAD_ENV, STREAM_MOMENTS_ENV, ZERO_BY_REGION_ENV)
from mbridge_offload.facts.reserve_rule import RESERVE_RULE_ENV
from mbridge_offload.runtime.cpu_threads import USER_OMP_ENV
from recipes import registry

EXIT_INVALID = 2


def problem_json(problem: Any) -> dict[str, Any]:
    """A report's problem (validation.Problem) as the commands' JSON says it."""
    return {"id": problem.rule_id, "key": problem.key, "value": problem.value, "rule": problem.rule,
            "fix": problem.fix, "severity": problem.severity}


def refusal_json(error: str, problems: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """What a command with a JSON output mode prints on stdout when it refuses (exit 2)."""
    return {"ok": False, "refused": True, "error": error, "problems": list(problems)}


def not_prepared_problems(refusal: BaseException) -> list[dict[str, Any]]:
    """The problems of a refused command line (prepare's NotPrepared): each override that cannot be applied; none
    for a refusal that is no list of problems (auto where nothing fits, flags that clash), whose message says it
    all."""
    return [{"id": "override/invalid", "key": e.key, "value": str(e.text).partition("=")[2], "rule": e.message,
             "fix": e.fix, "severity": "error"} for e in getattr(refusal, "override_errors", ())]


# The plugin's own variables that every command reads before it builds anything (mbridge_offload/fast_check/store.py
# and warm_worker.py read them), with what they take. MBRIDGE_OFFLOAD_ENGINE, _RESERVE_RULE, _STREAM_FETCH_AHEAD,
# _STREAM_MOMENTS, _COPY_PIECES_IN_FLIGHT, _COPY_PIECE_PAUSE_US, _ZERO_BY_REGION and _DELAYED_COPY_START are rules of
# the validator's table, refused there with the config's other problems; the rest are set by the plugin for its own
# child processes.
SWITCH_ENV = ("MBRIDGE_OFFLOAD_NO_CACHE", "MBRIDGE_OFFLOAD_NO_WORKER")  # read as on unless empty or 0
SECONDS_ENV = ("MBRIDGE_OFFLOAD_WORKER_IDLE_S",)
FOLDER_ENV = ("MBRIDGE_OFFLOAD_CACHE_DIR",)  # empty: unset, as store.cache_root reads it
# warm_worker.py holds MBRIDGE_OFFLOAD_IN_WORKER's name, but importing it reads WORKER_IDLE_S, which this check judges
OTHER_ENV = (ENGINE_ENV, RESERVE_RULE_ENV, FETCH_AHEAD_ENV, STREAM_MOMENTS_ENV, COPY_WINDOW_ENV, ZERO_BY_REGION_ENV,
             DELAYED_COPY_START_ENV, COPY_PAUSE_ENV, "MBRIDGE_OFFLOAD_IN_WORKER", USER_OMP_ENV)
ENV_PREFIX = "MBRIDGE_OFFLOAD_"


def environment_problem(environ: Mapping[str, str]) -> str | None:
    """What is wrong with the plugin's environment variables (each named with its value, the rule and the fix), or
    None. A value the plugin would read otherwise than meant is refused, never ignored: NO_CACHE=false turns the
    cache off, a CACHE_DIR that is a file leaves every command without a cache (~35 s each), a misspelt name does
    nothing at all."""
    import difflib
    import math

    problems = []
    for name in SWITCH_ENV:
        value = environ.get(name)
        if value is not None and value not in ("", "0", "1"):
            problems.append(f"{name}={value!r}: expects 1 (on) or 0 (off); any other value is read as on. Fix: "
                            f"{name}=1, or {name}=0 (or unset it) for off")
    for name in SECONDS_ENV:
        value = environ.get(name)
        if value is None:
            continue
        try:
            seconds = float(value)
        except ValueError:
            seconds = math.nan
        if not 0 < seconds < math.inf:
            problems.append(f"{name}={value!r}: expects a number of seconds above 0. Fix: {name}=900 (the default), "
                            f"or unset it")
    for name in FOLDER_ENV:
        value = environ.get(name)
        reason = unwritable_reason(Path(value)) if value else None
        if reason:
            problems.append(f"{name}={value!r}: {reason}. Fix: a folder this user can write, or unset it")
    known = SWITCH_ENV + SECONDS_ENV + FOLDER_ENV + OTHER_ENV
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX) and name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
            if close:
                problems.append(f"{name}: no such variable, so it would do nothing. Did you mean {close[0]}? "
                                f"Fix: rename it, or unset it")
    return "environment: " + "; ".join(problems) if problems else None


# options whose repeats add up instead of replacing each other
_REPEATABLE = (argparse._AppendAction, argparse._AppendConstAction, argparse._CountAction, argparse._HelpAction,
               argparse._VersionAction)


class RefusalParser(argparse.ArgumentParser):
    """An ArgumentParser that refuses in JSON on stdout too (``refusal_json``) when its command line asks for
    JSON with ``json_flag`` (a store_true flag, e.g. "--json"; None: the command has no JSON output). The
    words on stderr and the exit code are argparse's (or the subclass's); --help is unchanged."""

    def __init__(self, *args: Any, json_flag: str | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.json_flag = json_flag
        self.wants_json = False  # set from the command line as soon as it is parsed (before any error)
        self._said_json = self._parsing = False
        self._refusal: tuple[str, list[dict[str, Any]]] | None = None
        self._given: dict[argparse.Action, list[str]] = {}  # option -> the words it was given, this parse

    def _asks_json(self, argv: Sequence[str]) -> bool:
        if not self.json_flag:
            return False
        for token in argv:
            token = str(token)
            if token == "--":
                break
            if token == self.json_flag:
                return True
            if self.allow_abbrev and token.startswith("--") and len(token) > 2 and "=" not in token:
                matches = [o for o in self._option_string_actions if o.startswith(token)]
                if matches == [self.json_flag]:
                    return True
        return False

    def _parse(self, parse: Any, args: Sequence[str] | None, namespace: Any):
        """``parse(args, namespace)``, wants_json set from the whole command line first (parse_intermixed_args
        parses its positionals again without the options: that inner call leaves it as it is); then the plugin's
        environment variables (``environment_problem``), refused like a bad argument."""
        if self._parsing:
            return parse(args, namespace)
        self.wants_json = self._asks_json(sys.argv[1:] if args is None else list(args))
        self._parsing = True
        self._given = {}
        try:
            parsed = parse(args, namespace)
            problem = environment_problem(os.environ)  # after --help, which needs no environment
            if problem:
                self.error(problem)
            return parsed
        finally:
            self._parsing = False

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        """Each option's words as given, before its type reads them (Path('') would be the current folder):
        an empty value, or an option given twice (argparse keeps the last silently), is refused by name."""
        if action.option_strings and not isinstance(action, _REPEATABLE):
            name = "/".join(action.option_strings)
            if any(not str(word).strip() for word in arg_strings):
                wanted = action.metavar or action.dest.upper()
                self.error(f"argument {name}: an empty value ({' '.join(map(repr, arg_strings))}); give {wanted}"
                           + ("" if action.required else f", or drop {name}"))
            earlier = self._given.get(action)
            if earlier is not None:
                values = f" ({' '.join(earlier)}, then {' '.join(arg_strings)})" if arg_strings else ""
                meant = ", with the value meant" if arg_strings else ""
                self.error(f"argument {name}: given twice{values}, so one of them is stale or mistyped (the last "
                           f"would win without a word). Fix: give it once{meant}")
            self._given[action] = list(arg_strings)
        return super()._get_values(action, arg_strings)

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None):
        return self._parse(super().parse_known_args, args, namespace)

    def parse_known_intermixed_args(self, args: Sequence[str] | None = None, namespace: Any = None):
        return self._parse(super().parse_known_intermixed_args, args, namespace)

    def _say_json(self, error: str, problems: Sequence[dict[str, Any]] = ()) -> None:
        if self.wants_json and not self._said_json:
            self._said_json = True
            print(json.dumps(refusal_json(error, problems), indent=2), flush=True)

    def error(self, message: str, problems: Sequence[dict[str, Any]] = ()) -> NoReturn:
        self._refusal = (" ".join(str(message).split()), list(problems))
        super().error(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if status:
            error, problems = self._refusal or ((message or "").strip() or f"exit {status}", [])
            self._say_json(error, problems)
        super().exit(status, message)

    def refuse(self, message: str, problems: Sequence[dict[str, Any]] = (), code: int = EXIT_INVALID,
               said: str | None = None) -> int:
        """A refusal the command found after parsing: ``said`` (default ``message``) on stderr, the JSON
        refusal on stdout when asked for; returns ``code`` for main to return."""
        print(message if said is None else said, file=sys.stderr, flush=True)
        self._say_json(message, problems)
        return code


class CommandParser(RefusalParser):
    """An ArgumentParser whose refusals are one line (``prog: error: ...``) and exit 2; --help is unchanged."""

    def error(self, message: str, problems: Sequence[dict[str, Any]] = ()) -> NoReturn:
        message = " ".join(str(message).split())
        self._refusal = (message, list(problems))
        self.exit(EXIT_INVALID, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def recipe_or_exit(parser: RefusalParser, name: str) -> registry.Recipe:
    """The recipe, or the command's argument error (exit 2) with did-you-mean (in JSON: the fix)."""
    try:
        return registry.get(name)
    except registry.UnknownRecipe as unknown:
        fix = (" or ".join(f"--recipe {s}" for s in unknown.suggestions) if unknown.suggestions
               else "run_recipe.py --list shows every recipe")
        problem = {"id": "recipe/unknown", "key": "--recipe", "value": str(name), "rule": "unknown recipe",
                   "fix": fix, "severity": "error"}
        parser.error(str(unknown), problems=[problem])


def parse_command(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = parser.parse_intermixed_args(argv)
    recipe_or_exit(parser, args.recipe)
    return args


# The largest count a command passes on: torch.distributed, NCCL, OpenMP and Megatron's iteration counters hold
# counts as C ints; a larger one would fail, or wrap around, deep inside a run instead of here.
MAX_COUNT = 2**31 - 1


def _whole_number_at_least(minimum: int, unit: str, wanted: str, maximum: int = MAX_COUNT):
    """An argparse type: a whole number of ``unit`` (e.g. 'GPU') from ``minimum`` to ``maximum``, with errors that
    say which."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expects a whole number of {unit}s, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expects {wanted}, got {value}")
        if value > maximum:
            shown = text.strip() if len(text.strip()) <= 40 else f"{text.strip()[:20]}... ({len(text.strip())} digits)"
            raise argparse.ArgumentTypeError(f"expects at most {maximum} {unit}s (runs hold it as a C int), "
                                             f"got {shown}")
        return value

    parse.__name__ = f"{unit} count"
    return parse


def at_least_one(unit: str, maximum: int = MAX_COUNT):
    """An argparse type: a whole number of ``unit`` from 1 to ``maximum``."""
    return _whole_number_at_least(1, unit, f"at least 1 {unit}", maximum)


def not_negative(unit: str, maximum: int = MAX_COUNT):
    """An argparse type: a whole number of ``unit`` from 0 to ``maximum``."""
    return _whole_number_at_least(0, unit, f"0 or more {unit}s", maximum)


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


REPO = Path(__file__).resolve().parents[2]


def in_repository_reason(path: Path, flag: str, kind: str = "folder", resume: bool | None = None) -> str | None:
    """Why the command must not write ``path`` inside this repository's own tree, or None: the repository's
    folder, anything in it that git does not ignore (a tracked file, a new folder among the sources,
    which ``git add`` would pick up), and .git. ``resume``: an existing folder is a kept run continued in place, as
    docs/benchmarks/README.md reassembles its tables. Outside a git checkout (an installed plugin) nothing is
    refused."""
    if not (REPO / ".git").exists():
        return None
    target = Path(os.path.realpath(path))  # a link into the repository writes there too
    if target == REPO:
        return (f"{path} is this repository's own folder ({REPO}); the command would write among its files. Fix: "
                f"{flag} runs/<name> (git ignores runs/) or a folder outside the repository")
    if not target.is_relative_to(REPO):
        return None
    import subprocess

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)

    try:
        if resume and kind == "folder" and target.is_dir():  # kept runs, unless it is a folder of sources
            sources = [f for f in git("ls-files", "--", str(target)).stdout.splitlines() if f.endswith(".py")]
            if not sources:
                return None
        ignored = git("check-ignore", "-q", str(target) + ("/" if kind == "folder" else "")).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return None  # no git to ask: the checkout is not one git can read here either
    if ignored and target.relative_to(REPO).parts[:1] != (".git",):
        return None
    resumable = (" (add --resume to continue the runs kept there)" if resume is False and kind == "folder"
                 and target.is_dir() else "")
    overwrite = " and overwrite a tracked one" if kind == "file" and target.exists() else ""
    return (f"{path} is inside this repository ({REPO}) where git does not ignore it, so what the command writes "
            f"would mix with the plugin's own files{overwrite}. Fix: {flag} under runs/ (git ignores it) or outside "
            f"the repository{resumable}")


def check_writable(parser: argparse.ArgumentParser, flag: str, path: Path | None, kind: str = "folder",
                   resume: bool | None = None) -> None:
    """Refuse (exit 2, one line) a ``flag`` folder or file the command could not write, or must not (inside this
    repository's own tree: ``in_repository_reason``; ``resume``: the command's --resume, None where it has none)."""
    if path is None:
        return
    reason = unwritable_reason(path, kind) or in_repository_reason(path, flag, kind, resume)
    if reason:
        parser.error(f"{flag}: {reason}")


def make_dir(parser: argparse.ArgumentParser, flag: str, path: Path, resume: bool | None = None) -> None:
    """Create the ``flag`` folder, or refuse in one line when the system says no (``check_writable``)."""
    check_writable(parser, flag, path, resume=resume)
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


def announce_unparsable(overrides: Sequence[str]) -> None:
    """Before Megatron Bridge loads (~35 s): the overrides that do not parse, at once, so a typo is seen and can
    be fixed without the wait. The full report, with what the other overrides make of the config, follows once it
    has loaded (checking those needs the built recipe)."""
    from overrides import OverrideErrors
    from overrides.grammar import parse

    _, errors = parse(list(overrides))
    if errors:
        print(f"{OverrideErrors(errors).format()}\n(seen before loading Megatron Bridge; the full report follows once "
              "it has loaded, ~35 s: Ctrl-C stops here)", file=sys.stderr, flush=True)


def refuse_bad_overrides(parser: RefusalParser, recipe_name: str, overrides: list[str]) -> None:
    """Before any training starts: overrides that cannot be applied to the recipe are refused (exit 2, the
    override errors), from the cache of the recipe (mbridge_offload/fast_check), else by building the recipe
    here once; each run's run_recipe.py validates the rest."""
    from mbridge_offload import fast_check

    message = fast_check.override_errors(registry.get(recipe_name), overrides, build=True,
                                         before_build=lambda: announce_unparsable(overrides))
    if message:
        sys.exit(parser.refuse(message, said=f"{parser.prog}: error: " + message))


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
