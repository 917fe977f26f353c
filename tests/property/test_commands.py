"""Property tests of every command's arguments (scripts/*.py, called in-process through their ``main``):
no input produces a traceback, every refusal exits 2 naming the key or flag it refuses, and a refused
command launches nothing and writes nothing (dry runs where a launch would happen; the launching functions
of the sweeps and benchmarks are replaced by a stub that records the call)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overrides.grammar import key_of

sys.path.insert(0, str(Path(__file__).parent))  # tests are imported by path (--import-mode=importlib)
from cmdline_strategies import (DENSE, GARBAGE, SEED, SHORT_FLAGS, override_texts, override_values,  # noqa: E402
                                short_flag_args)

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class Launched(Exception):
    """Raised by the stub that replaces what starts trainings or measurements."""


@contextlib.contextmanager
def _in(folder: Path):
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def run(main, argv: list[str]) -> tuple[int | str, str]:
    """``main(argv)`` in an empty folder: its exit code (or "launched") and everything it printed. Any
    exception other than SystemExit fails the test (a traceback for the user)."""
    out, err = io.StringIO(), io.StringIO()
    folder = Path(tempfile.mkdtemp(prefix="cmd-cwd-"))
    with _in(folder), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as stop:
            rc = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else f"exit {stop.code!r}")
        except Launched:
            rc = "launched"
    text = out.getvalue() + err.getvalue()
    assert "Traceback" not in text, text
    if rc != "launched":
        assert not any(folder.iterdir()), f"{argv} wrote {list(folder.iterdir())} into the working folder"
    return rc, text


def names_what_it_refuses(text: str, argv: list[str], config_keys: list[str]) -> bool:
    """A refusal names a key or flag: one the command line gave, or a config key (a rule's own key)."""
    if "Invalid override" in text:  # each refused override is quoted as typed, with its key
        return True
    given = {key_of(a).lstrip("-") for a in argv if a}
    if any(g and g in text for g in given if len(g) > 1):
        return True
    if re.search(r"(^|\s)--?[a-z][a-z-]*", text):
        return True
    return any(key in text for key in config_keys)


# --- run_recipe.py -----------------------------------------------------------------------------------

@SETTINGS
@given(data=st.data())
def test_run_recipe_overrides_and_short_flags(warm_cache, config_keys, data):
    from mbridge_offload.cli.run_recipe import main

    overrides = data.draw(st.lists(override_texts(config_keys), max_size=3), label="overrides")
    flags = data.draw(short_flag_args(), label="short flags")
    argv = ["--recipe", data.draw(st.sampled_from((SEED, DENSE))), "--dry-run", *flags, *overrides]
    rc, text = run(main, argv)
    assert rc in (0, 2), (argv, rc, text[-2000:])
    if rc == 2:
        assert names_what_it_refuses(text, argv, config_keys), (argv, text[-2000:])


@SETTINGS
@given(value=override_values(), flag=st.sampled_from(SHORT_FLAGS))
def test_every_short_flag_value_is_answered(warm_cache, config_keys, flag, value):
    from mbridge_offload.cli.run_recipe import main

    argv = ["--recipe", DENSE, "--dry-run", flag, value]
    rc, text = run(main, argv)
    assert rc in (0, 2), (argv, rc, text[-2000:])
    if rc == 2:
        assert names_what_it_refuses(text, argv, config_keys), (argv, text[-2000:])


RUN_RECIPE_OPTIONS = ("--num-gpus", "--cpu-threads", "--offload-tuning", "--overlap-chunks", "--gpu-memory-gib",
                      "--host-memory-gib", "--gpus-per-node", "--margin-gib", "--host-margin-gib",
                      "--host-link-gbps", "--host-memory-gbps", "--step-time-budget-s", "--recipe")


def option_args(options: tuple[str, ...]) -> st.SearchStrategy[list[str]]:
    pair = st.tuples(st.sampled_from(options), st.one_of(override_values(), GARBAGE))
    return st.lists(pair, max_size=3).map(lambda pairs: [x for p in pairs for x in p])


@SETTINGS
@given(data=st.data())
def test_run_recipe_options(warm_cache, config_keys, data):
    from mbridge_offload.cli.run_recipe import main

    argv = ["--recipe", DENSE, "--dry-run", *data.draw(option_args(RUN_RECIPE_OPTIONS))]
    rc, text = run(main, argv)
    assert rc in (0, 2), (argv, rc, text[-2000:])
    if rc == 2:
        assert names_what_it_refuses(text, argv, config_keys), (argv, text[-2000:])


@SETTINGS
@given(name=st.text(alphabet="qwen3_0123456789abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=40))
def test_unknown_recipe_names_are_refused_with_suggestions(name):
    from recipes import registry
    from mbridge_offload.cli.run_recipe import main

    rc, text = run(main, [f"--recipe={name}", "--dry-run"])
    if name in {r.name for r in registry.RECIPES}:
        return
    assert rc == 2 and f"unknown recipe {name!r}" in text and len(text.strip().splitlines()) == 1, text


# --- plan_offload.py ---------------------------------------------------------------------------------

@SETTINGS
@given(data=st.data())
def test_plan_offload(warm_cache, config_keys, data):
    from mbridge_offload.cli.plan_offload import main

    argv = ["--recipe", SEED, *data.draw(short_flag_args()),
            *data.draw(option_args(RUN_RECIPE_OPTIONS[:1] + RUN_RECIPE_OPTIONS[4:-1])),
            *data.draw(st.lists(override_texts(config_keys), max_size=2)), *data.draw(st.sampled_from(([], ["--json"])))]
    rc, text = run(main, argv)
    assert rc in (0, 2), (argv, rc, text[-2000:])
    if rc == 2:
        assert names_what_it_refuses(text, argv, config_keys), (argv, text[-2000:])


# --- the commands that start trainings: sweep_offload.py, bench_offload.py, check_resume.py, check_auto.py

def _launch_stubs(mp: pytest.MonkeyPatch, calls: list) -> None:
    def launched(*args, **kwargs):
        calls.append(args)
        raise Launched()

    import mbridge_offload.bench.host_measure as host_measure
    import mbridge_offload.bench.overhead as overhead
    import mbridge_offload.cli.check_auto as check_auto
    import mbridge_offload.cli.check_resume as check_resume
    import mbridge_offload.cli.sweep_offload as sweep_offload

    mp.setattr(sweep_offload, "run_sweep", launched)
    mp.setattr(check_resume, "check_resume", launched)
    mp.setattr(check_auto, "check_auto", launched)
    mp.setattr(overhead, "measure", launched)
    mp.setattr(overhead, "run_benchmark", launched)
    mp.setattr(host_measure, "measure_host", launched)


COMMAND_OPTIONS = {
    "sweep_offload": ("--fractions", "--num-gpus", "--baseline-runs", "--timeout"),
    "bench_offload": ("--fractions", "--configs", "--num-gpus", "--baseline-runs", "--repeats", "--timeout",
                      "--host-json"),
    "check_resume": ("--fractions", "--save-at", "--offload-tuning", "--stop-by", "--timeout"),
    "check_auto": ("--device-gib", "--steps", "--timeout"),
}


@SETTINGS
@given(data=st.data(), command=st.sampled_from(sorted(COMMAND_OPTIONS)))
def test_training_commands_refuse_before_launching(warm_cache, config_keys, data, command):
    import importlib

    from mbridge_offload import fast_check
    from recipes import registry

    main = importlib.import_module(f"mbridge_offload.cli.{command}").main
    out = Path(tempfile.mkdtemp(prefix="cmd-out-")) / "out"
    overrides = data.draw(st.lists(override_texts(config_keys), max_size=2))
    argv = ["--recipe", DENSE, "--out", str(out), *data.draw(option_args(COMMAND_OPTIONS[command])), *overrides]
    calls: list = []
    with pytest.MonkeyPatch.context() as mp:
        _launch_stubs(mp, calls)
        rc, text = run(main, argv)
    assert rc in (2, "launched"), (argv, rc, text[-2000:])
    if rc == 2:
        assert names_what_it_refuses(text, argv, config_keys), (argv, text[-2000:])
        assert not out.exists(), f"{argv}: refused, yet created {out}"
    else:  # what reached a launch applies to the recipe
        given_overrides = [o for o in overrides if "," not in o.split("=", 1)[-1]]
        assert fast_check.override_errors(registry.get(DENSE), given_overrides) is None, argv


# --- measure_host.py and diagnose.py -----------------------------------------------------------------

@SETTINGS
@given(data=st.data())
def test_measure_host(data):
    from mbridge_offload.cli.measure_host import main

    target = Path(tempfile.mkdtemp(prefix="cmd-json-"))
    (target / "a_file").write_text("x")
    json_path = data.draw(st.sampled_from((target / "new" / "host.json", target / "a_file" / "host.json", target)))
    argv = [*data.draw(option_args(("--size-mib", "--threads"))), *data.draw(st.sampled_from(([], ["--json",
                                                                                                    str(json_path)])))]
    calls: list = []
    with pytest.MonkeyPatch.context() as mp:
        _launch_stubs(mp, calls)
        rc, text = run(main, argv)
    assert rc in (2, "launched"), (argv, rc, text)
    if rc == 2:
        assert re.search(r"--[a-z]", text), text
        assert not (target / "new").exists()


@SETTINGS
@given(data=st.data())
def test_diagnose_arguments(data):
    diagnose = pytest.importorskip("mbridge_offload.cli.diagnose")
    folder = Path(tempfile.mkdtemp(prefix="cmd-logs-"))
    (folder / "empty.log").write_text("")
    logs = data.draw(st.lists(st.one_of(st.sampled_from((str(folder / "missing.log"), str(folder),
                                                          str(folder / "empty.log"))), GARBAGE), max_size=2))
    argv = [*logs, *data.draw(st.lists(st.sampled_from(("--json", "--no-build", "--bogus")), max_size=2))]
    rc, text = run(diagnose.main, argv)
    assert rc in (0, 1, 2, 3), (argv, rc, text)
