"""Commands with a JSON output mode (plan_offload.py --json, diagnose.py --json) refuse in JSON too: when they
exit 2, stdout is one object, {"ok": false, "refused": true, "error": ..., "problems": [...]}, with the problem
fields the plan's own JSON has, beside the same words on stderr as without --json. Run as the user runs them:
the real scripts, in fresh processes (tests/conftest.py gives them a cache of their own and no worker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECIPE = "qwen3_1b_proxy_pretrain_config"
PLAN = ["scripts/plan_offload.py", "--recipe", RECIPE, "--json"]
PROBLEM_FIELDS = {"id", "key", "value", "rule", "fix", "severity"}


def run(argv: list[str], *python_flags: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *python_flags, str(REPO / argv[0]), *argv[1:]], cwd=REPO,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env})


def without_import_times(done: subprocess.CompletedProcess) -> tuple[str, list[str]]:
    """stderr of a ``-X importtime`` run, and the modules it imported."""
    lines = done.stderr.splitlines(keepends=True)
    imported = [line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")]
    return "".join(line for line in lines if not line.startswith("import time:")), imported


def refused(done: subprocess.CompletedProcess, code: int = 2) -> dict:
    """The JSON refusal on stdout: exit ``code``, ok false, the words of stderr, each problem with every field."""
    assert done.returncode == code, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    data = json.loads(done.stdout)
    assert data["ok"] is False and data["refused"] is True, data
    assert data["error"] and data["error"] in done.stderr, (data["error"], done.stderr)
    assert all(set(p) == PROBLEM_FIELDS for p in data["problems"]), data["problems"]
    return data


def only_problem(data: dict) -> dict:
    assert len(data["problems"]) == 1, data["problems"]
    return data["problems"][0]


def test_an_unknown_key():
    done = run([*PLAN, "model.num_layerz=3"])
    problem = only_problem(refused(done))
    assert problem["key"] == "model.num_layerz" and problem["value"] == "3" and problem["severity"] == "error"
    assert "unknown key" in problem["rule"] and "model.num_layers" in problem["fix"]
    assert "Invalid override (1):" in done.stderr  # the human words, as without --json


def test_an_override_that_is_not_valid_syntax():
    problem = only_problem(refused(run([*PLAN, "model.num_layers=["])))
    assert problem["key"] == "model.num_layers" and problem["fix"] == "close the brackets: model.num_layers=[]"


def test_a_value_out_of_its_range():
    """A config that is made but breaks a rule: the plan's JSON, said refused, with the rule's problem."""
    done = run([*PLAN, "model.num_layers=-3"])
    assert done.returncode == 2, done.stderr[-2000:]
    data = json.loads(done.stdout)
    assert data["ok"] is False and data["refused"] is True and "total_bytes_gpu" in data
    problem = next(p for p in data["problems"] if p["key"] == "model.num_layers")
    assert problem["value"] == "-3" and problem["severity"] == "error"
    assert problem["fix"].startswith("model.num_layers=")


def test_auto_where_nothing_fits():
    data = refused(run([*PLAN, "--gpu-memory-gib", "1", "optimizer.optimizer_offload_fraction=auto"]))
    assert data["error"].startswith("optimizer.optimizer_offload_fraction=auto: nothing fits")
    assert data["problems"] == []


def test_a_misspelled_recipe():
    done = run(["scripts/plan_offload.py", "--recipe", "qwen3_1b_proxy_pretrain_confg", "--json"])
    data = refused(done)
    assert data["error"].startswith("unknown recipe 'qwen3_1b_proxy_pretrain_confg'")
    problem = only_problem(data)
    assert problem["key"] == "--recipe" and problem["value"] == "qwen3_1b_proxy_pretrain_confg"
    assert problem["fix"].startswith(f"--recipe {RECIPE}")
    assert done.stderr.count("\n") == 1  # the one line of before


@pytest.mark.parametrize("argv,said", [
    (["--num-gpus", "0"], "argument --num-gpus: expects at least 1 GPU, got 0"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["-tp", "x"], "-tp"),
])
def test_an_argument_error(argv, said):
    done = run([*PLAN, *argv])
    data = refused(done)
    assert said in data["error"] and data["problems"] == []
    assert done.stderr.startswith("plan_offload.py: error: ") and done.stderr.count("\n") == 1


def test_an_abbreviated_json_flag_is_the_json_flag():
    data = refused(run(["scripts/plan_offload.py", "--recipe", RECIPE, "--js", "--num-gpus", "0"]))
    assert "--num-gpus" in data["error"]


def test_without_json_stdout_stays_empty():
    done = run(["scripts/plan_offload.py", "--recipe", RECIPE, "model.num_layerz=3"])
    assert done.returncode == 2 and done.stdout == "" and "model.num_layerz" in done.stderr


def test_a_plan_that_is_made_says_ok():
    done = run([*PLAN, "--gpu-memory-gib", "141"])
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout)
    assert data["ok"] is True and data["refused"] is False and data["problems"] == [] and data["fits_gpu"] is True


# the same command line as tests/scripts/test_warm_worker.py's, whose worker answers it
SAME_EVERYWHERE = ["scripts/plan_offload.py", "--recipe", "qwen3_0p6b_pretrain_config", "--json", "model.num_layerz=3",
                   "optimizer.lr"]


def test_the_refusal_is_the_same_from_megatron_bridge_and_from_the_cache(tmp_path):
    """The slow path (Megatron Bridge loaded; it fills the cache) and then the fast path (the recipe's cache,
    no Megatron import) print the same JSON and the same words."""
    cache = {"MBRIDGE_OFFLOAD_CACHE_DIR": str(tmp_path / "cache")}
    slow = run(SAME_EVERYWHERE, "-X", "importtime", **cache)
    fast = run(SAME_EVERYWHERE, "-X", "importtime", **cache)
    (slow_err, slow_imported), (fast_err, fast_imported) = without_import_times(slow), without_import_times(fast)
    assert "megatron.bridge" in slow_imported and not any(m.startswith("megatron") for m in fast_imported)
    slow.stderr, fast.stderr = slow_err, fast_err
    assert [p["key"] for p in refused(slow)["problems"]] == ["model.num_layerz", "optimizer.lr"]
    assert fast.returncode == slow.returncode and fast.stdout == slow.stdout and fast_err == slow_err


def test_diagnose_refuses_an_empty_or_missing_log_in_json(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_text("")
    data = refused(run(["scripts/diagnose.py", "--json", "--no-build", str(empty)]))
    assert str(empty) in data["error"] and "empty" in data["error"]
    data = refused(run(["scripts/diagnose.py", "--json", str(tmp_path / "missing.log")]))
    assert data["error"] == f"no such file: {tmp_path / 'missing.log'}"
    data = refused(run(["scripts/diagnose.py", "--json"]))
    assert "give at least one LOG" in data["error"]
    done = run(["scripts/diagnose.py", "--no-build", str(empty)])  # without --json: stderr only, as before
    assert done.returncode == 2 and done.stdout == "" and str(empty) in done.stderr


def test_diagnose_refuses_only_when_no_log_can_be_read_naming_each_in_json(tmp_path):
    """Several LOGs: one that cannot be read no longer cancels the others; when none can, the refusal names each, a
    problem per LOG in JSON (its path the value, why the rule) and a line each on stderr."""
    empty, missing = tmp_path / "rank0.log", tmp_path / "rank1.log"
    empty.write_text("")
    data = refused(run(["scripts/diagnose.py", "--json", "--no-build", str(empty), str(missing)]))
    assert data["error"] == "none of the 2 LOGs could be read"
    assert [(p["id"], p["value"]) for p in data["problems"]] == [("log/unreadable", str(empty)),
                                                                 ("log/unreadable", str(missing))]
    assert "is empty" in data["problems"][0]["rule"] and data["problems"][1]["rule"] == f"no such file: {missing}"
    oom = tmp_path / "rank2.log"
    oom.write_text("[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    done = run(["scripts/diagnose.py", "--json", "--no-build", str(empty), str(oom)])
    assert done.returncode == 0 and [r["unreadable"] is None for r in json.loads(done.stdout)] == [False, True]
    assert done.stderr.strip() == f"diagnose.py: {empty} is empty: nothing to diagnose. Give the run's output (the " \
                                  "file torchrun's or srun's stdout/stderr went to, e.g. slurm-JOBID.out)"
