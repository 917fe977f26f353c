"""Every user-facing command refuses a missing or unreadable file, an unknown recipe (with did-you-mean), a
bad flag and a folder it cannot write with exit 2 and one clear line: no traceback, and no Megatron import
for these (checked in fresh processes)."""

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
    extra = [str(tmp_path / "o") if a == "OUT" else a for a in COMMANDS_WITH_RECIPE[command]]
    line = refusal(command, ["--recipe", "qwen3_1b_proxy_pretrain_confg", *extra])
    assert "unknown recipe 'qwen3_1b_proxy_pretrain_confg'" in line
    assert "Did you mean: qwen3_1b_proxy_pretrain_config" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", sorted(COMMANDS_WITH_RECIPE) + ["measure_host"])
def test_bad_flag(command, tmp_path):
    extra = [str(tmp_path / "o") if a == "OUT" else a for a in COMMANDS_WITH_RECIPE.get(command, [])]
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
    line = refusal(command, [str(tmp_path / "o") if a == "OUT" else a for a in argv])
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


@pytest.mark.parametrize("command,argv", [
    ("run_recipe", ["--recipe", RECIPE, "--out", "TARGET"]),
    ("sweep_offload", ["--recipe", RECIPE, "--out", "TARGET"]),
    ("bench_offload", ["--recipe", RECIPE, "--out", "TARGET"]),
    ("check_resume", ["--recipe", RECIPE, "--out", "TARGET"]),
    ("check_auto", ["--recipe", RECIPE, "--out", "TARGET", "--device-gib", "16"]),
    ("measure_host", ["--json", "TARGET/host.json"]),
])
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


@pytest.mark.parametrize("argv", [
    ["scripts/run_recipe.py", "--recipe", "qwen3_30b_a3b_pretrain_confg", "--dry-run"],
    ["scripts/plan_offload.py", "--recipe", "nope"],
    ["scripts/plan_offload.py", "--recipe", "nope", "--json"],  # its JSON refusal on stdout, no import either
    ["scripts/plan_offload.py", "--recipe", RECIPE, "--json", "--num-gpus", "0"],
    ["scripts/sweep_offload.py", "--recipe", RECIPE, "--out", "/dev/null/x"],
    ["scripts/bench_offload.py", "--recipe", RECIPE, "--out", "o", "--host-json", "/nonexistent.json"],
    ["scripts/check_resume.py", "--recipe", RECIPE, "--out", "o", "--bogus"],
    ["scripts/check_auto.py", "--recipe", RECIPE, "--out", "o", "--device-gib", "16", "--bogus"],
    ["scripts/measure_host.py", "--json", "/dev/null/host.json"],
])
def test_refusals_need_no_megatron(argv, tmp_path):
    """In a fresh process: exit 2, one line, and Megatron never imported (``-X importtime`` lists it)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", str(REPO / argv[0]), *argv[1:]], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), "MBRIDGE_OFFLOAD_NO_CACHE": "1"})
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    imported = [line for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
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
