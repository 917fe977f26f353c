"""check_auto.py's reading of runs: auto's choice from run_recipe.py's own line, the outcome of each run, and
the verdict on the pair, including runs that shared the GPU with another process (H200 runs under
docs/benchmarks/planner-auto/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mbridge_offload.bench.auto_check import RunOutcome, auto_choice, judge, outcome_of, strangers_in

AUTO_RUNS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "planner-auto"


def test_auto_choice_reads_the_line_prepare_prints(built):
    from mbridge_offload.planning import GIB
    from mbridge_offload.prepare import resolve_auto

    cfg = built("qwen3_1p7b_pretrain_config")
    fraction, line = resolve_auto(cfg, 1, {"gpu_memory_gib": 40.0})
    choice = auto_choice("some output\n" + line + "\nmore output")
    assert choice is not None and choice.fraction == fraction and choice.device_gib == 40.0
    from mbridge_offload.planning import plan

    chosen = plan(cfg, 1, fraction=fraction, gpu_memory_gib=40.0)
    assert choice.planned_total_gib == round(chosen.total_bytes_gpu / GIB, 1)
    assert choice.margin_gib == round(chosen.margin_gib, 2)
    assert auto_choice("no auto here") is None


def test_outcome_of_a_recorded_pair():
    """The 1.7B pair on a 32 GiB device: both runs trained; the one below left more than the margin free."""
    case = AUTO_RUNS / "1p7b-sl2048"
    ballast = json.loads((case / "ballast-auto.log").read_text().split("ballast ready ", 1)[1].splitlines()[0])
    at_auto = outcome_of({"fraction": 0.65, "dir": str(case / "auto"),
                          "summary": json.loads((case / "auto" / "summary.json").read_text())},
                         32.0, ballast["held_gib"], ballast_pid=-1, strangers_after={})
    assert at_auto.outcome == "trained" and 0 < at_auto.headroom_gib < 32
    choice = auto_choice((case / "auto" / "log.txt").read_text())
    below = outcome_of({"fraction": 0.6, "dir": str(case / "fraction-0.6"),
                        "summary": json.loads((case / "fraction-0.6" / "summary.json").read_text())},
                       32.0, ballast["held_gib"], ballast_pid=-1, strangers_after={})
    ok, why = judge(choice, at_auto, below)
    assert not ok and "auto could have chosen it" in why


def test_a_run_beside_another_process_is_not_valid():
    """The MoE pair's auto run ran out of memory while a run left by an interrupted command held 22.78 GiB:
    torch's message names that process, and the verdict says the pair must run again."""
    log = (AUTO_RUNS / "moe-proxy-2-sl8192" / "auto" / "log.txt").read_text()
    assert strangers_in(log, ballast_pid=2415) == {2319: 22.78}
    outcome = outcome_of({"fraction": 0.7, "dir": str(AUTO_RUNS / "moe-proxy-2-sl8192" / "auto"),
                          "reason": "CUDA out of memory."}, 36.0, 103.79, ballast_pid=2415, strangers_after={})
    assert outcome.outcome.startswith("not valid") and "2319" in outcome.outcome
    choice = auto_choice(log)
    ok, why = judge(choice, outcome, None)
    assert not ok and "run the pair again" in why


@pytest.mark.parametrize("below_outcome, headroom, expected", [
    ("out of memory", None, True),
    ("trained", 0.3, True),
    ("trained", 2.0, False),
    ("failed: exit code 1", None, False),
])
def test_judge(below_outcome, headroom, expected):
    from mbridge_offload.bench.auto_check import AutoChoice

    choice = AutoChoice(fraction=0.5, planned_total_gib=30.0, margin_gib=0.6, device_gib=32.0)
    at_auto = RunOutcome(fraction=0.5, outcome="trained", device_used_gib=29.0, headroom_gib=3.0, run_dir="a")
    below = RunOutcome(fraction=0.45, outcome=below_outcome, device_used_gib=None if headroom is None else 32 - headroom,
                       headroom_gib=headroom, run_dir="b")
    assert judge(choice, at_auto, below)[0] is expected
    failed_auto = RunOutcome(fraction=0.5, outcome="out of memory", device_used_gib=None, headroom_gib=None, run_dir="a")
    assert judge(choice, failed_auto, below)[0] is False


def test_without_a_usable_gpu_the_check_refuses_in_one_line(tmp_path, capsys):
    """The ballast cannot make this machine's GPU any size without CUDA: exit 2, one line, no run started."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the check would run")
    from mbridge_offload.cli.check_auto import main

    code = main(["--recipe", "qwen3_1b_proxy_pretrain_config", "--device-gib", "16", "--out", str(tmp_path / "o"),
                 "model.num_layers=2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("check_auto.py: error: --device-gib 16: the device ballast did not start"), err
    assert not (tmp_path / "o" / "auto").exists()


def test_each_run_of_the_check_is_one_gpu_whatever_the_recipe_says(capsys):
    """The fourteenth session's Qwen3-4B pair (docs/benchmarks/planner-auto-3/4b-sl2048-mb2): the recipe asks for
    2 GPUs (TP 2); made TP 1 with micro batch 2 and global batch 2, the check's run took DP 2 and was refused. With
    the check's own options it is one GPU: valid, and auto is planned for the whole optimizer state on that GPU: it
    picks a fraction that check ran on its 81 GiB device and that trained there."""
    from mbridge_offload.bench.auto_check import launch_arguments
    from mbridge_offload.cli import run_recipe

    overrides = ["model.tensor_model_parallel_size=1", "model.seq_length=2048", "dataset.seq_length=2048",
                 "train.micro_batch_size=2", "train.global_batch_size=2", "optimizer.optimizer_offload_fraction=auto"]
    code = run_recipe.main(["--recipe", "qwen3_4b_pretrain_config", "--dry-run", *launch_arguments(81), *overrides])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "Validation for 1 GPU: OK" in out and "TP1 PP1 CP1 DP1" in out
    picked = float(out.split("optimizer.optimizer_offload_fraction=auto -> ")[1].split()[0])
    (check,) = json.loads((AUTO_RUNS.parent / "planner-auto-3/4b-sl2048-mb2/auto_check.json").read_text())
    assert check["device_gib"] == 81
    runs = {check[k]["fraction"]: check[k]["outcome"] for k in ("at_auto", "below", "two_below") if check.get(k)}
    assert runs.get(picked) == "trained", (picked, runs)


def test_an_nccl_allocation_that_found_the_gpu_full_is_out_of_memory():
    """The H200 run of docs/benchmarks/alloc-tight/ whose NCCL communicator found the device full in step 1: its
    log says "unhandled cuda error ... Failed to CUDA calloc", not "out of memory"; the check counts it as OOM."""
    run_dir = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "alloc-tight" / "1b-proxy-fraction-1"
    reason = json.loads((run_dir / "failure.json").read_text())["reason"]
    outcome = outcome_of({"fraction": 1.0, "dir": str(run_dir), "reason": reason}, 21.44, 118.36, ballast_pid=1059,
                         strangers_after={})
    assert outcome.outcome == "out of memory"


def test_nccls_own_account_of_the_failed_allocation_is_out_of_memory_too():
    """The same H200 case with NCCL_DEBUG=INFO (fifteenth session): NCCL's warning 'Cuda failure 2 'out of memory''
    in a communicator's channel setup, hundreds of lines of NCCL's allocations around it."""
    run_dir = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "alloc-tight" / "1b-proxy-fraction-1-nccl-debug"
    reason = json.loads((run_dir / "failure.json").read_text())["reason"]
    outcome = outcome_of({"fraction": 1.0, "dir": str(run_dir), "reason": reason}, 21.44, 118.36, ballast_pid=1114,
                         strangers_after={})
    assert outcome.outcome == "out of memory"


@pytest.mark.parametrize("log", [
    # NCCL's pinned host buffer: the same CUDA warning, then a host allocation (more offload makes it worse)
    "node1:4929:5001 [0] misc/cudawrap.cc:189 NCCL WARN Cuda failure 2 'out of memory'\n"
    "node1:4929:5001 [0] include/alloc.h:48 NCCL WARN Failed to CUDA host alloc 4194304 bytes\n",
    # a calloc that failed because an earlier fault left the device unusable
    "RuntimeError: CUDA error: an illegal memory access was encountered\nFailed to CUDA calloc async 4 bytes\n",
], ids=["pinned-host", "after-a-fault"])
def test_what_diagnose_tells_apart_from_the_device_out_of_memory_check_auto_does_too(tmp_path, log):
    (tmp_path / "log.txt").write_text(log)
    reason = "DistBackendError: NCCL error: unhandled cuda error"
    outcome = outcome_of({"fraction": 0.5, "dir": str(tmp_path), "reason": reason}, 40.0, 99.0, ballast_pid=1,
                         strangers_after={})
    assert outcome.outcome == f"failed: {reason}"


def test_the_goal_is_decided_by_the_first_step_down_that_does_not_train():
    """Less offload needs more GPU memory, so the first fraction below auto that runs out of memory bounds the
    smallest that trains: one step down, auto is the smallest; two steps down, it is one above (the goal holds);
    a second step that trains means auto is two or more above."""
    from mbridge_offload.bench.auto_check import AutoChoice, goal_of, markdown

    choice = AutoChoice(fraction=0.5, planned_total_gib=30.0, margin_gib=0.6, device_gib=32.0)

    def run(fraction: float, outcome: str) -> RunOutcome:
        used = 31.0 if outcome == "trained" else None
        return RunOutcome(fraction=fraction, outcome=outcome, device_used_gib=used,
                          headroom_gib=None if used is None else 32 - used, run_dir=str(fraction))

    at_auto = run(0.5, "trained")
    assert goal_of(choice, at_auto, run(0.45, "out of memory"), None).startswith("met: auto (0.5) is the smallest")
    assert goal_of(choice, at_auto, run(0.45, "trained"), run(0.4, "out of memory")).startswith(
        "met: 0.45 is the smallest that trains")
    assert goal_of(choice, at_auto, run(0.45, "trained"), run(0.4, "trained")).startswith("not met: 0.4 trains too")
    assert goal_of(choice, at_auto, run(0.45, "trained"), None).startswith("not decided")
    assert goal_of(choice, run(0.5, "out of memory"), None, None).startswith("not met")
    # rows written before the second step (committed under docs/benchmarks/) still print
    old_row = {"recipe": "r", "overrides": [], "device_gib": 32.0, "steps": 3, "auto": None, "at_auto": None,
               "below": None, "ok": False, "verdict": "v"}
    assert markdown([old_row]).splitlines()[-1].endswith("| NO | v | - |")


def test_a_check_cut_after_its_second_run_leaves_a_row_that_says_so():
    """planner-auto-4's Qwen3-4B check was cut by the device's time in its third run (0.10 below) in the seventeenth
    session and ran whole in the eighteenth (its first two runs the same to the byte on the GPU). Its recorded runs,
    cut after the second as the first check was: the row written then keeps both runs' outcomes, judges nothing and
    says where the check stopped; with the third run, the row is the finished check's own (auto_check.json)."""
    from mbridge_offload.bench.auto_check import check_row, markdown

    case = AUTO_RUNS.parent / "planner-auto-4" / "4b-sl8192"

    def recorded(name: str, fraction: float) -> RunOutcome:
        log = (case / f"ballast-{name}.log").read_text()
        ballast = json.loads(log.split("ballast ready ", 1)[1].splitlines()[0])
        return outcome_of({"fraction": fraction, "dir": str(case / name),
                           "summary": json.loads((case / name / "summary.json").read_text())},
                          100.0, ballast["held_gib"], ballast_pid=-1, strangers_after={})

    choice = auto_choice((case / "auto" / "log.txt").read_text(errors="replace"))
    assert choice.fraction == 0.7 and choice.device_gib == 100.0
    at_auto, below = recorded("auto", 0.7), recorded("fraction-0.65", 0.65)
    assert at_auto.outcome == below.outcome == "trained" and below.headroom_gib > choice.margin_gib
    overrides = ["model.tensor_model_parallel_size=1", "model.seq_length=8192", "dataset.seq_length=8192",
                 "train.micro_batch_size=1", "train.global_batch_size=1"]
    row = check_row("qwen3_4b_pretrain_config", overrides, 100.0, 3, choice, at_auto, below, None,
                    stopped_after="the run at 0.65")
    assert row["ok"] is None and row["verdict"].startswith("not judged: the check stopped after the run at 0.65")
    assert row["goal"] == "not decided: the check stopped after the run at 0.65"
    assert f"0.65: trained, {below.device_used_gib:.2f}" in markdown([row])
    assert "| - | not judged" in markdown([row])
    # the same two runs, judged as a finished check would: 0.65 leaves more than the margin
    finished = check_row("qwen3_4b_pretrain_config", overrides, 100.0, 3, choice, at_auto, below, None)
    assert not finished["ok"] and "auto could have chosen it" in finished["verdict"]
    # with the third run (0.6 trained too), the finished check's own row: the goal is not met
    two_below = recorded("fraction-0.6", 0.6)
    whole = check_row("qwen3_4b_pretrain_config", overrides, 100.0, 3, choice, at_auto, below, two_below)
    (committed,) = json.loads((case / "auto_check.json").read_text())
    for key in ("recipe", "overrides", "device_gib", "steps", "auto", "ok", "verdict", "goal"):
        assert whole[key] == committed[key], key
    for run in ("at_auto", "below", "two_below"):
        assert {k: v for k, v in whole[run].items() if k != "run_dir"} == \
            {k: v for k, v in committed[run].items() if k != "run_dir"}, run
    assert whole["goal"] == "not met: 0.6 trains too, two steps below auto"
