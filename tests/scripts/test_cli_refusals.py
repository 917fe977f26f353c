"""Every user-facing command refuses a missing or unreadable file, an unknown recipe (with did-you-mean), a
bad flag and a folder it cannot write with exit 2 and one clear line: no traceback, and no Megatron import
for these (checked in fresh processes). So too what argparse alone would take with another meaning: an option
given twice (argparse keeps the last), an empty value (``--out ''`` is the current folder), a count that no run can
hold, an output inside this repository's own files, and a plugin environment variable whose value or name would be
read otherwise than meant."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECIPE = "qwen3_1b_proxy_pretrain_config"


def _main(command: str):
    import importlib

    return importlib.import_module(f"mbridge_offload.cli.{command}").main


def refusal(command: str, argv: list[str]) -> str:
    """Run ``command``'s main in-process; it must exit 2 with exactly one line on stderr, which is returned."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        with pytest.raises(SystemExit) as stop:
            _main(command)(argv)
    assert stop.value.code == 2, (argv, stop.value.code, err.getvalue())
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err.getvalue(), err.getvalue()
    assert lines[0].startswith(f"{command}.py: error: ")
    return lines[0]


def _argv(argv: list[str], tmp_path: Path) -> list[str]:
    return [str(tmp_path / "o") if a == "OUT" else a for a in argv]


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "a_file"
    path.write_text("not a folder\n")
    return path


COMMANDS_WITH_RECIPE = {
    "run_recipe": ["--dry-run"], "plan_offload": [], "sweep_offload": ["--out", "OUT"],
    "bench_offload": ["--out", "OUT"], "check_resume": ["--out", "OUT"],
    "check_auto": ["--out", "OUT", "--device-gib", "16"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS_WITH_RECIPE))
def test_unknown_recipe_with_suggestions(command, tmp_path):
    extra = _argv(COMMANDS_WITH_RECIPE[command], tmp_path)
    line = refusal(command, ["--recipe", "qwen3_1b_proxy_pretrain_confg", *extra])
    assert "unknown recipe 'qwen3_1b_proxy_pretrain_confg'" in line
    assert "Did you mean: qwen3_1b_proxy_pretrain_config" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", sorted(COMMANDS_WITH_RECIPE) + ["measure_host"])
def test_bad_flag(command, tmp_path):
    extra = _argv(COMMANDS_WITH_RECIPE.get(command, []), tmp_path)
    recipe = ["--recipe", RECIPE] if command != "measure_host" else []
    line = refusal(command, [*recipe, *extra, "--no-such-flag"])
    assert "--no-such-flag" in line


@pytest.mark.parametrize("command,argv,flag", [
    ("run_recipe", ["--recipe", RECIPE, "--num-gpus", "0"], "--num-gpus"),
    ("run_recipe", ["--recipe", RECIPE, "-tp", "x"], "-tp"),
    ("run_recipe", ["--recipe", RECIPE, "--gpu-memory-gib", "nan"], "--gpu-memory-gib"),
    ("plan_offload", ["--recipe", RECIPE, "--num-gpus", "-3"], "--num-gpus"),
    ("plan_offload", ["--recipe", RECIPE, "--gpus-per-node", "0"], "--gpus-per-node"),
    ("sweep_offload", ["--recipe", RECIPE, "--out", "OUT", "--fractions", "2"], "--fractions"),
    ("sweep_offload", ["--recipe", RECIPE, "--out", "OUT", "--timeout", "-1"], "--timeout"),
    ("bench_offload", ["--recipe", RECIPE, "--out", "OUT", "--repeats", "0"], "--repeats"),
    ("check_resume", ["--recipe", RECIPE, "--out", "OUT", "--save-at", "0"], "--save-at"),
    ("check_auto", ["--recipe", RECIPE, "--out", "OUT", "--device-gib", "0"], "--device-gib"),
    ("check_auto", ["--recipe", RECIPE, "--out", "OUT", "--device-gib", "16", "--steps", "0"], "--steps"),
    ("check_auto", ["--recipe", RECIPE, "--out", "OUT"], "--device-gib"),
    ("measure_host", ["--threads", "0,x"], "--threads"),
    ("measure_host", ["--size-mib", "0"], "--size-mib"),
])
def test_bad_flag_values(command, argv, flag, tmp_path):
    line = refusal(command, _argv(argv, tmp_path))
    assert flag in line
    assert not (tmp_path / "o").exists()


def test_missing_and_unreadable_files(tmp_path, a_file):
    line = refusal("bench_offload", ["--recipe", RECIPE, "--out", str(tmp_path / "o"), "--host-json",
                                     str(tmp_path / "missing.json")])
    assert "--host-json" in line and "no such file" in line
    line = refusal("bench_offload", ["--recipe", RECIPE, "--out", str(tmp_path / "o"), "--host-json", str(a_file)])
    assert "--host-json" in line and "not JSON" in line
    line = refusal("bench_offload", ["--recipe", RECIPE, "--out", str(tmp_path / "o"), "--host-json", str(tmp_path)])
    assert "is a folder, not a file" in line
    line = refusal("plan_offload", ["--compare", str(tmp_path / "missing")])
    assert "--compare" in line and "no such folder" in line
    line = refusal("plan_offload", ["--compare", str(a_file)])
    assert "is a file, not a folder" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file whatever its mode")
def test_unreadable_file(tmp_path):
    path = tmp_path / "host.json"
    path.write_text("{}")
    path.chmod(0)
    line = refusal("bench_offload", ["--recipe", RECIPE, "--out", str(tmp_path / "o"), "--host-json", str(path)])
    assert "cannot read" in line


# the commands that write a run folder, --out TARGET
OUT_COMMANDS = [
    ("run_recipe", ["--recipe", RECIPE, "--out", "TARGET"]),
    ("sweep_offload", ["--recipe", RECIPE, "--out", "TARGET"]),
    ("bench_offload", ["--recipe", RECIPE, "--out", "TARGET"]),
    ("check_resume", ["--recipe", RECIPE, "--out", "TARGET"]),
    ("check_auto", ["--recipe", RECIPE, "--out", "TARGET", "--device-gib", "16"]),
]


@pytest.mark.parametrize("command,argv", [*OUT_COMMANDS, ("measure_host", ["--json", "TARGET/host.json"])])
def test_a_folder_it_cannot_write(command, argv, a_file, tmp_path, monkeypatch):
    # a file where the folder should be, and a file on the way to it
    for target in (a_file, a_file / "sub"):
        if command == "measure_host" and target == a_file:
            target = a_file / "x"
        line = refusal(command, [str(target) if a == "TARGET" else a.replace("TARGET", str(target)) for a in argv])
        assert "is a file, not a folder" in line, line
    # a read-only file system (root writes anywhere else; the check asks statvfs)
    import mbridge_offload.cli.parsing as parsing

    monkeypatch.setattr(parsing, "_read_only_mount", lambda path: True)
    line = refusal(command, [a.replace("TARGET", str(tmp_path / "new")) for a in argv])
    assert "read-only" in line and not (tmp_path / "new").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    line = refusal("sweep_offload", ["--recipe", RECIPE, "--out", str(folder / "out")])
    assert "not writable" in line


def test_world_size_that_is_not_a_count(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "zero")
    line = refusal("run_recipe", ["--recipe", RECIPE, "--dry-run"])
    assert "WORLD_SIZE" in line


@pytest.mark.parametrize("argv,env", [
    (["scripts/run_recipe.py", "--recipe", "qwen3_30b_a3b_pretrain_confg", "--dry-run"], {}),
    (["scripts/plan_offload.py", "--recipe", "nope"], {}),
    (["scripts/plan_offload.py", "--recipe", "nope", "--json"], {}),  # its JSON refusal on stdout, no import either
    (["scripts/plan_offload.py", "--recipe", RECIPE, "--json", "--num-gpus", "0"], {}),
    (["scripts/sweep_offload.py", "--recipe", RECIPE, "--out", "/dev/null/x"], {}),
    (["scripts/bench_offload.py", "--recipe", RECIPE, "--out", "o", "--host-json", "/nonexistent.json"], {}),
    (["scripts/check_resume.py", "--recipe", RECIPE, "--out", "o", "--bogus"], {}),
    (["scripts/check_auto.py", "--recipe", RECIPE, "--out", "o", "--device-gib", "16", "--bogus"], {}),
    (["scripts/measure_host.py", "--json", "/dev/null/host.json"], {}),
    (["scripts/run_recipe.py", "--recipe", RECIPE, "--dry-run", "--num-gpus", "2", "--num-gpus", "4"], {}),
    (["scripts/sweep_offload.py", "--recipe", RECIPE, "--out", ""], {}),
    (["scripts/run_recipe.py", "--recipe", RECIPE, "--dry-run"], {"MBRIDGE_OFFLOAD_WORKER_IDLE_S": "abc"}),
    (["scripts/measure_host.py", "--json", str(REPO / "README.md")], {}),
])
def test_refusals_need_no_megatron(argv, env, tmp_path):
    """In a fresh process: exit 2, one line, no traceback, Megatron never imported (``-X importtime`` lists it), and
    nothing written."""
    proc = subprocess.run([sys.executable, "-X", "importtime", str(REPO / argv[0]), *argv[1:]], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), "MBRIDGE_OFFLOAD_NO_CACHE": "1", **env})
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    imported = [line for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not any("megatron" in line or "| torch" in line for line in imported)
    assert not any(tmp_path.iterdir())


def test_unparsable_overrides_are_shown_before_megatron_loads():
    """A typo in an override is known without the recipe: it is printed before Megatron Bridge is imported (~35 s),
    in a fresh process, with the override, the problem and the fix."""
    probe = ("import sys\n"
             "from mbridge_offload.cli.parsing import announce_unparsable\n"
             "announce_unparsable(['optimizer.optimizer_offload_fraction=0.5', 'model.x=[1', '=5'])\n"
             "assert 'megatron.bridge' not in sys.modules, 'announced after loading Megatron Bridge'\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Invalid overrides (2):" in done.stderr
    assert "fix: close the brackets: model.x=[1]" in done.stderr
    assert "no key before '='" in done.stderr
    assert "optimizer_offload_fraction" not in done.stderr.split("fix:")[0]  # the valid one is not listed


def test_run_recipe_announces_unparsable_overrides_before_building(capsys, monkeypatch):
    """Built here (no cache, no warm worker, as on a first run): the typo is shown before the build starts."""
    monkeypatch.setenv("MBRIDGE_OFFLOAD_NO_CACHE", "1")
    code = _main("run_recipe")(["--recipe", RECIPE, "--dry-run", "model.x=[1", "model.num_layerz=3"])
    err = capsys.readouterr().err
    assert code == 2
    announced = err.index("seen before loading Megatron Bridge")
    assert err.index("model.x=[1") < announced < err.index("Building ")
    assert "model.num_layerz" in err[announced:]  # the full report names the unknown key too


@pytest.mark.parametrize("command,argv,named,values", [
    ("run_recipe", ["--recipe", RECIPE, "--num-gpus", "4", "--dry-run", "--num-gpus", "8"], "--num-gpus", "4, then 8"),
    ("run_recipe", ["--recipe", RECIPE, "--recipe", "qwen3_8b_pretrain_config", "--dry-run"], "--recipe",
     f"{RECIPE}, then qwen3_8b_pretrain_config"),
    ("run_recipe", ["--recipe", RECIPE, "-tp", "2", "--dry-run", "-tp", "4"], "-tp", "2, then 4"),
    ("run_recipe", ["--recipe", RECIPE, "--num-gpu", "2", "--num-gpus=4", "--dry-run"], "--num-gpus", "2, then 4"),
    ("run_recipe", ["--recipe", RECIPE, "--dry-run", "--dry-run"], "--dry-run", ""),
    ("sweep_offload", ["--recipe", RECIPE, "--out", "OUT", "--out", "OUT"], "--out", ", then "),
    ("bench_offload", ["--recipe", RECIPE, "--out", "OUT", "--repeats", "3", "--repeats", "5"], "--repeats",
     "3, then 5"),
    ("check_auto", ["--recipe", RECIPE, "--out", "OUT", "--device-gib", "16", "--device-gib", "32"], "--device-gib",
     "16, then 32"),
    ("plan_offload", ["--recipe", RECIPE, "--num-gpus", "8", "--num-gpus", "16"], "--num-gpus", "8, then 16"),
    ("measure_host", ["--size-mib", "64", "--size-mib", "128"], "--size-mib", "64, then 128"),
])
def test_an_option_given_twice_is_refused(command, argv, named, values, tmp_path):
    line = refusal(command, _argv(argv, tmp_path))
    assert f"argument {named}" in line and "given twice" in line and "give it once" in line, line
    assert values in line, line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name,meant,path", [
    ("QWEN3_1B_PROXY_PRETRAIN_CONFIG", RECIPE, False),  # other case: no near name by spelling alone
    (f"recipes.qwen3_dense:{RECIPE}", RECIPE, True),  # a module reference: the function it names
    (f"recipes/qwen3_dense.py:{RECIPE}", RECIPE, True),
    ("qwen3_0p6b_pretrain_config.py", "qwen3_0p6b_pretrain_config", True),
    ("../x", None, True),
    ("recipes/qwen3_dense.py", None, True),
])
@pytest.mark.parametrize("command", ["run_recipe", "sweep_offload"])
def test_a_recipe_named_by_path_or_in_other_case(command, name, meant, path, tmp_path):
    line = refusal(command, ["--recipe", name, "--out", str(tmp_path / "o")] + (["--dry-run"] if command ==
                                                                                 "run_recipe" else []))
    assert f"unknown recipe {name!r}" in line, line
    if meant:
        assert f"Did you mean: {meant}?" in line, line  # the one meant, alone
    assert ("not a file or a module path" in line) is path, line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command,argv,named", [
    ("run_recipe", ["--recipe", "", "--dry-run"], "--recipe"),
    ("run_recipe", ["--recipe", RECIPE, "--out", ""], "--out"),  # Path('') is the current folder
    ("sweep_offload", ["--recipe", RECIPE, "--out", " "], "--out"),
    ("bench_offload", ["--recipe", RECIPE, "--out", "OUT", "--host-json", ""], "--host-json"),
    ("check_resume", ["--recipe", RECIPE, "--out", "OUT", "--fractions", ""], "--fractions"),
    ("measure_host", ["--json", ""], "--json"),
])
def test_an_empty_value_is_refused(command, argv, named, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = refusal(command, _argv(argv, tmp_path))
    assert f"argument {named}: an empty value" in line, line
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("command,argv,named", [
    ("run_recipe", ["--recipe", RECIPE, "--dry-run", "--num-gpus", str(2**31)], "--num-gpus"),
    ("run_recipe", ["--recipe", RECIPE, "--dry-run", "--overlap-chunks", "9" * 30], "--overlap-chunks"),
    ("sweep_offload", ["--recipe", RECIPE, "--out", "OUT", "--baseline-runs", str(2**63)], "--baseline-runs"),
    ("check_resume", ["--recipe", RECIPE, "--out", "OUT", "--save-at", str(2**30)], "--save-at"),  # it trains 2K
])
def test_counts_no_run_can_hold_are_refused(command, argv, named, tmp_path):
    line = refusal(command, _argv(argv, tmp_path))
    assert f"argument {named}: expects at most" in line, line
    assert not (tmp_path / "o").exists()


def test_the_largest_count_is_taken():
    from mbridge_offload.cli.parsing import MAX_COUNT, at_least_one

    assert at_least_one("GPU")(str(MAX_COUNT)) == MAX_COUNT


@pytest.mark.parametrize("command,argv", OUT_COMMANDS)
@pytest.mark.parametrize("target", ["recipes/run-1", ".", "mbridge_offload/cli", ".git/run-1"])
def test_an_output_folder_among_the_repositorys_own_files_is_refused(command, argv, target):
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: nothing of it to protect")
    path = REPO / target
    line = refusal(command, [str(path) if a == "TARGET" else a for a in argv])
    assert f"--out: {path}" in line and "repository" in line, line
    assert "Fix:" in line, line
    assert not (REPO / "recipes" / "run-1").exists() and not (REPO / ".git" / "run-1").exists()


def test_a_tracked_file_is_not_overwritten():
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: nothing of it to protect")
    before = (REPO / "README.md").read_bytes()
    line = refusal("measure_host", ["--json", str(REPO / "README.md")])
    assert "overwrite a tracked one" in line, line
    assert (REPO / "README.md").read_bytes() == before


def test_what_git_ignores_and_kept_runs_with_resume_are_taken():
    """runs/ (ignored by git) is where a checkout's runs go; with --resume an existing folder is a kept table
    continued in place (docs/benchmarks/README.md reassembles its tables so); outside the repository anything."""
    from mbridge_offload.cli.parsing import in_repository_reason

    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    assert in_repository_reason(REPO / "runs" / "sweep-1", "--out") is None
    assert in_repository_reason(Path("/tmp/mbridge-offload-runs/x"), "--out") is None
    assert in_repository_reason(REPO.parent / "runs-beside-the-checkout", "--out") is None
    kept = REPO / "docs" / "benchmarks" / "dense-1b-sweep"
    assert kept.is_dir()
    assert in_repository_reason(kept, "--out", resume=True) is None
    refused = in_repository_reason(kept, "--out", resume=False)
    assert refused and "add --resume" in refused
    assert in_repository_reason(REPO, "--out", resume=True)  # never the repository itself
    assert in_repository_reason(REPO / "recipes", "--out", resume=True)  # nor a folder of its sources


@pytest.mark.parametrize("env,named", [
    ({"MBRIDGE_OFFLOAD_NO_CACHE": "false"}, "MBRIDGE_OFFLOAD_NO_CACHE='false'"),  # read as on
    ({"MBRIDGE_OFFLOAD_NO_WORKER": "yes"}, "MBRIDGE_OFFLOAD_NO_WORKER='yes'"),
    ({"MBRIDGE_OFFLOAD_WORKER_IDLE_S": "abc"}, "MBRIDGE_OFFLOAD_WORKER_IDLE_S='abc'"),  # was a traceback
    ({"MBRIDGE_OFFLOAD_WORKER_IDLE_S": "nan"}, "MBRIDGE_OFFLOAD_WORKER_IDLE_S='nan'"),
    ({"MBRIDGE_OFFLOAD_WORKER_IDLE_S": "-5"}, "MBRIDGE_OFFLOAD_WORKER_IDLE_S='-5'"),
    ({"MBRIDGE_OFFLOAD_CACHE_DIR": "A_FILE"}, "is a file, not a folder"),  # the cache silently never worked
    ({"MBRIDGE_OFFLOAD_NOCACHE": "1"}, "Did you mean MBRIDGE_OFFLOAD_NO_CACHE?"),  # a typo does nothing
    ({"MBRIDGE_OFFLOAD_ENGIN": "exact"}, "Did you mean MBRIDGE_OFFLOAD_ENGINE?"),
    ({"MBRIDGE_OFFLOAD_STREAM_MOMENT": "bf16"}, "Did you mean MBRIDGE_OFFLOAD_STREAM_MOMENTS?"),
    ({"MBRIDGE_OFFLOAD_COPY_PIECE_IN_FLIGHT": "1"}, "Did you mean MBRIDGE_OFFLOAD_COPY_PIECES_IN_FLIGHT?"),
])
@pytest.mark.parametrize("command,argv", [
    ("run_recipe", ["--recipe", RECIPE, "--dry-run"]),
    ("sweep_offload", ["--recipe", RECIPE, "--out", "OUT"]),
    ("measure_host", []),
])
def test_a_bad_plugin_environment_variable_is_refused(env, named, command, argv, tmp_path, monkeypatch):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    for name, value in env.items():
        monkeypatch.setenv(name, str(a_file) if value == "A_FILE" else value)
    line = refusal(command, _argv(argv, tmp_path))
    assert "environment: " in line and named in line and "Fix:" in line, line
    assert not (tmp_path / "o").exists()


def test_good_plugin_environment_values_are_taken(monkeypatch, tmp_path, capsys):
    from mbridge_offload.cli.run_recipe import main

    for name, value in {"MBRIDGE_OFFLOAD_NO_CACHE": "1", "MBRIDGE_OFFLOAD_NO_WORKER": "0",
                        "MBRIDGE_OFFLOAD_WORKER_IDLE_S": "30.5", "MBRIDGE_OFFLOAD_CACHE_DIR": str(tmp_path / "new"),
                        "MBRIDGE_OFFLOAD_ENGINE": "exact", "MBRIDGE_OFFLOAD_COPY_PIECES_IN_FLIGHT": "1"}.items():
        monkeypatch.setenv(name, value)
    assert main(["--list"]) == 0
    assert RECIPE in capsys.readouterr().out
