"""The dry check of a GPU session's commands (mbridge_offload/cli/phase_check.py): every command of the phases
docs/benchmarks/README.md lists as not run yet, and every step of multi-gpu/run.sh on 4 and on 2 GPUs, must pass
the plugin's validation for the GPU count it names before device time is spent on it. The other h200.sh phases
(already run; their commands are the record of what ran) are left to ``python -m mbridge_offload.cli.phase_check``.
"""

from __future__ import annotations

import pytest

from mbridge_offload.cli import phase_check

# docs/benchmarks/README.md's "Not run yet" list when this test was written; the check reads the list itself
LISTED = {"planner-auto-6", "stream-lazy-bench", "delayed-threads"}


@pytest.fixture(scope="module")
def found():
    return phase_check.check_sources(["not-run-yet", "multi-gpu"], [4, 2])


def test_the_not_run_yet_phases_are_read_from_the_readme():
    phases = phase_check.not_run_yet()
    assert LISTED <= set(phases)
    assert set(phases) <= set(phase_check.h200_phases())


def test_collecting_runs_no_command():
    """The recorder stands in for python: run.sh's 13 calls come back, in order, with $RUNS in their paths, and
    nothing was trained (the recorder exits at once)."""
    source = phase_check.collect(phase_check.Source("multi-gpu/run.sh 2", phase_check.MULTI_GPU_SCRIPT, ["2"]))
    assert source.exit_code == 0
    assert len(source.calls) == 13
    assert source.calls[0].argv[:3] == ["scripts/sweep_offload.py", "--recipe", "qwen3_30b_a3b_proxy_pretrain_config"]
    assert "$RUNS/moe-pp2-n2" in source.calls[0].argv
    assert source.calls[-1].argv[:2] == ["-m", "mbridge_offload.bench.engine_parity"]


def test_every_not_run_yet_phase_and_multi_gpu_step_passes_validation(found):
    names = {s.name for s in found}
    assert LISTED <= names and {"multi-gpu/run.sh 4", "multi-gpu/run.sh 2"} <= names
    for source in found:
        assert source.exit_code == 0 and source.calls, (source.name, source.stderr)
    assert all(s.ok for s in found), phase_check.report(found)
    trainings = [c for s in found for c in s.checked if c.status != "skipped"]
    assert sum(c.runs for c in trainings) >= 50  # the sweeps, benches and checks were expanded into their runs
    # run.sh's step 4 is there to be refused
    assert sum(c.status == "expected refusal" for s in found for c in s.checked) == 2


def test_a_refused_command_is_found(found):
    """The command that would have wasted a session: global batch 2 with micro batch 2 on 2 data-parallel ranks."""
    call = phase_check.Call(["scripts/run_recipe.py", "--recipe", "qwen3_1b_proxy_pretrain_config", "--num-gpus", "2",
                             "--deterministic", "--offload-engine", "exact", "train.global_batch_size=2",
                             "optimizer.optimizer_cpu_offload=True", "optimizer.optimizer_offload_fraction=1"], {})
    checked = phase_check.Checker().check(call, "multi-gpu/run.sh 2")
    assert checked.status == "refused"
    assert "parallel/global-batch" in {p["id"] for p in checked.errors}
    assert "train.global_batch_size" in phase_check.report([phase_check.Source("x", phase_check.MULTI_GPU_SCRIPT, [],
                                                                               [call], 0, "", [checked])])


def test_a_bench_too_short_for_a_speed_figure_is_found(found):
    call = phase_check.Call(["scripts/bench_offload.py", "--recipe", "qwen3_1b_proxy_pretrain_config", "--out", "x",
                             "--fractions", "1", "--configs", "tuned", "--repeats", "1", "train.train_iters=8"], {})
    checked = phase_check.Checker().check(call)
    assert checked.status == "refused" and "--short-runs" in checked.errors[0]["rule"]
