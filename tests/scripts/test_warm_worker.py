"""The checking worker (mbridge_offload/fast_check/warm_worker.py): a dry run of a configuration never
validated before answers in seconds once a worker has Megatron Bridge loaded, with the same output and exit
code as the command answering alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mbridge_offload.fast_check import warm_worker

REPO = Path(__file__).resolve().parents[2]
DRY_RUN = [sys.executable, "scripts/run_recipe.py", "--recipe", "qwen3_1b_proxy_pretrain_config", "--dry-run"]
PLAN_REFUSED = ["scripts/plan_offload.py", "--recipe", "qwen3_0p6b_pretrain_config", "--json", "model.num_layerz=3",
                "optimizer.lr"]  # test_json_refusals.py's SAME_EVERYWHERE


@pytest.fixture
def worker_env(tmp_path, monkeypatch):
    env = {**os.environ, "MBRIDGE_OFFLOAD_CACHE_DIR": str(tmp_path / "cache"), "MBRIDGE_OFFLOAD_WORKER_IDLE_S": "300"}
    env.pop("MBRIDGE_OFFLOAD_NO_WORKER", None)
    env.pop("MBRIDGE_OFFLOAD_NO_CACHE", None)
    env.pop(warm_worker.IN_WORKER_ENV, None)
    for key in ("MBRIDGE_OFFLOAD_CACHE_DIR", "MBRIDGE_OFFLOAD_WORKER_IDLE_S"):
        monkeypatch.setenv(key, env[key])
    yield env


def _run(command: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    return done, time.monotonic() - started


def test_a_new_configuration_is_answered_by_the_worker_in_seconds_and_the_same(worker_env):
    worker = warm_worker._start(warm_worker.socket_path())
    try:
        deadline = time.monotonic() + 300
        while not warm_worker.socket_path().exists():
            assert worker.poll() is None and time.monotonic() < deadline, "the worker did not come up"
            time.sleep(1)
        # never validated before: no cache entry can answer it
        command = DRY_RUN + ["-gb", "16", "model.num_layers=6"]
        fast, seconds = _run(command, worker_env)
        assert fast.returncode == 0, fast.stderr
        assert seconds < 20, f"{seconds:.1f} s; its stderr:\n{fast.stderr[-3000:]}"
        assert "Validation for 1 GPU: OK" in fast.stdout
        # a refusal comes back with its exit code, its lines on the caller's stderr
        refused, _ = _run(DRY_RUN + ["model.num_layers=6", "model.tensor_model_parallel_size=3"], worker_env)
        assert refused.returncode == 2 and "tensor_model_parallel_size" in refused.stdout + refused.stderr
        alone, _ = _run(command, {**worker_env, "MBRIDGE_OFFLOAD_NO_WORKER": "1", "MBRIDGE_OFFLOAD_NO_CACHE": "1"})
        assert alone.returncode == 0 and alone.stdout == fast.stdout
        # plan_offload --json's refusal: the worker's (a recipe this cache has not seen) is the fast path's, which
        # test_json_refusals.py finds equal to the slow path's
        plan = [sys.executable, *PLAN_REFUSED]
        by_worker, seconds = _run(plan, worker_env)
        assert by_worker.returncode == 2 and seconds < 20, (seconds, by_worker.stderr)
        assert json.loads(by_worker.stdout)["problems"][0]["key"] == "model.num_layerz"
        from_cache, _ = _run(plan, worker_env)  # the worker's answer stored the recipe
        assert from_cache.returncode == 2 and from_cache.stdout == by_worker.stdout
        assert from_cache.stderr == by_worker.stderr
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def test_no_worker_answers_inside_a_worker_or_when_turned_off(worker_env, monkeypatch):
    monkeypatch.setenv("MBRIDGE_OFFLOAD_NO_WORKER", "1")
    assert not warm_worker.enabled() and warm_worker.ask("run_recipe", ["--help"]) is None
    monkeypatch.delenv("MBRIDGE_OFFLOAD_NO_WORKER")
    monkeypatch.setenv(warm_worker.IN_WORKER_ENV, "1")
    assert not warm_worker.enabled()


def test_the_worker_key_changes_with_the_plugins_sources(tmp_path, monkeypatch):
    key = warm_worker.worker_key()
    source = REPO / "recipes" / "_worker_key_probe.py"
    source.write_text("# changes the plugin's sources\n")
    try:
        warm_worker.worker_key.cache_clear()
        assert warm_worker.worker_key() != key
    finally:
        source.unlink()
        warm_worker.worker_key.cache_clear()


def test_the_worker_key_changes_with_the_machine(monkeypatch):
    """A cache folder in a home directory shared by a login node and a GPU node: each machine its own worker (a Unix
    socket answers only where it was made, and the worker validates against its own machine's GPUs)."""
    import socket

    key = warm_worker.worker_key()
    monkeypatch.setattr(socket, "gethostname", lambda: "another-node-of-the-cluster")
    try:
        warm_worker.worker_key.cache_clear()
        assert warm_worker.worker_key() != key
    finally:
        monkeypatch.undo()
        warm_worker.worker_key.cache_clear()


def test_a_dry_run_validated_once_is_answered_from_the_cache_by_the_next_process(worker_env):
    """Two fresh processes: the first builds, validates and fills the cache after loading Megatron Bridge; the second,
    which loads nothing, must find that validation (both key the same machine and installation)."""
    env = {**worker_env, "MBRIDGE_OFFLOAD_NO_WORKER": "1"}
    command = DRY_RUN + ["-gb", "16"]
    first, _ = _run(command, env)
    assert first.returncode == 0 and "built and validated" in first.stderr, first.stderr
    second, seconds = _run(command, env)
    assert second.returncode == 0 and "answered from the cache" in second.stderr, second.stderr
    assert second.stdout == first.stdout and seconds < 20
