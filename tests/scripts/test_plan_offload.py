"""plan_offload.py: auto means what it means for run_recipe.py, refusing with the alternatives when
nothing fits (it used to plan fraction 1 then)."""

from __future__ import annotations

import json
import re

import pytest

from mbridge_offload.cli import plan_offload, run_recipe

NOTHING_FITS = ["--recipe", "qwen3_8b_pretrain_config", "--num-gpus", "1", "-tp", "1", "--gpu-memory-gib", "80",
                "optimizer.optimizer_offload_fraction=auto"]
EIGHT_B = ["--recipe", "qwen3_8b_pretrain_config", "--num-gpus", "1", "-tp", "1", "-sl", "2048", "-gb", "2",
           "--gpu-memory-gib", "110", "-of", "auto"]


def test_auto_refuses_with_the_alternatives_when_nothing_fits(capsys):
    assert plan_offload.main(NOTHING_FITS) == 2
    planned = capsys.readouterr()
    refusal = planned.err[planned.err.index("optimizer.optimizer_offload_fraction=auto: nothing fits"):]
    assert planned.out == "" and "What would fit" in refusal and "pipeline_model_parallel_size=2" in refusal
    assert run_recipe.main([*NOTHING_FITS, "--dry-run"]) == 2
    assert capsys.readouterr().err.endswith(refusal)  # the same words as run_recipe's


def test_auto_refuses_when_no_fraction_fits_both_gpu_and_host(capsys):
    assert plan_offload.main([*EIGHT_B, "--json", "--host-memory-gib", "40"]) == 2
    captured = capsys.readouterr()
    assert "auto: nothing fits both: the GPU needs fraction" in captured.err
    # --json: the refusal in JSON on stdout too, in the same words (tests/scripts/test_json_refusals.py)
    assert json.loads(captured.out) == {"ok": False, "refused": True, "error": captured.err.strip(), "problems": []}


def test_auto_plans_the_fraction_run_recipe_would_run(capsys):
    assert plan_offload.main([*EIGHT_B, "--host-memory-gib", "500"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Memory plan for qwen3_8b_pretrain_config on 1 GPU (fraction=auto):")
    assert run_recipe.main([*EIGHT_B, "--host-memory-gib", "500", "--dry-run"]) == 0
    fraction = capsys.readouterr().out.split("optimizer.optimizer_offload_fraction=auto -> ")[1].split()[0]
    assert re.search(rf"optimizer offload fraction +{re.escape(fraction)} \(", out)


def test_several_bad_arguments_are_refused_together_in_one_line(capsys):
    """argparse stops at the first bad value; each is named at once, with the unknown recipe's did-you-mean."""
    import pytest

    with pytest.raises(SystemExit) as exited:
        plan_offload.main(["--recipe", "qwen3_8b_pretrain_cfg", "--gpu-memory-gib", "0", "--margin-gib=-1",
                           "--num-gpus", "0", "--host-link-gbps", "nan", "--gpus-per", "x"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    for said in ("argument --recipe: unknown recipe 'qwen3_8b_pretrain_cfg'", "qwen3_8b_pretrain_config",
                 "argument --gpu-memory-gib: expects GiB above 0, got '0'",
                 "argument --margin-gib: expects GiB at least 0, got '-1'",
                 "argument --num-gpus: expects at least 1 GPU, got 0",
                 "argument --host-link-gbps: expects GB/s above 0, got 'nan'",
                 "argument --gpus-per-node: expects a whole number of ranks, got 'x'"):
        assert said in err, said


def test_help_and_argument_errors_answer_without_importing_megatron_bridge():
    """--help and the argument errors come before the Megatron import (~35 s): in well under 2 s, none loaded."""
    import subprocess
    import sys
    import time

    script = ("import sys\nfrom mbridge_offload.cli import plan_offload\n"
              "for argv in (['--help'], ['--recipe', 'qwen3_8b_pretrain_config', '--margin-gib', 'inf', "
              "'--gpu-memory-gib', '-3']):\n"
              "    try:\n        plan_offload.main(argv)\n    except SystemExit as e:\n        print('exit', e.code)\n"
              "print(sorted(m for m in sys.modules if m.startswith('megatron')))\n")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - started
    assert done.stdout.splitlines()[-3:] == ["exit 0", "exit 2", "[]"], done.stdout[-500:] + done.stderr[-500:]
    assert "2 invalid arguments" in done.stderr and seconds < 2.0, seconds


# Launches run_recipe.py refuses at once, one per family of the validator's rules, that the planner planned (and auto
# chose a fraction for) while it ran only the rules its arithmetic needs: (recipe, GPUs, overrides, rule, key).
REFUSED_LAUNCHES = [
    ("qwen3_30b_a3b_proxy_pretrain_config", 2, ["model.tensor_model_parallel_size=2", "model.sequence_parallel=False"],
     "parallel/moe-tp-needs-sequence-parallel", "model.sequence_parallel"),
    ("qwen3_0p6b_optimizer_offload_config", 1, ["optimizer.use_distributed_optimizer=False",
                                                "ddp.use_distributed_optimizer=False"],
     "optimizer-offload/distributed-optimizer", "optimizer.use_distributed_optimizer"),
    ("qwen3_0p6b_activation_offload_config", 1, ["model.recompute_granularity=full", "model.recompute_method=uniform",
                                                 "model.recompute_num_layers=1"],
     "activation-offload/recompute", "model.recompute_granularity"),
    ("qwen3_0p6b_pretrain_config", 1, ["model.fine_grained_activation_offloading=True",
                                       "model.offload_modules=[attn_proj]", "++env_vars.NVTE_CPU_OFFLOAD_V1=1"],
     "fine-grained/attn-proj-needs-core-attn", "model.offload_modules"),
]


@pytest.mark.parametrize("recipe_name,gpus,overrides,rule_id,key", REFUSED_LAUNCHES,
                         ids=[case[3] for case in REFUSED_LAUNCHES])
def test_a_launch_run_recipe_refuses_is_not_planned_and_auto_picks_no_fraction(capsys, built, recipe_name, gpus,
                                                                               overrides, rule_id, key):
    """plan_offload.py refuses it with the validator's own problem (its id, key, value, rule and fix), among all of
    the launch's errors at once; -of auto chooses no fraction for it."""
    from overrides import apply_overrides
    from mbridge_offload.validation import validate

    argv = ["--recipe", recipe_name, "--num-gpus", str(gpus), "--gpu-memory-gib", "139.8", *overrides]
    expected = [p for p in validate(apply_overrides(built(recipe_name), overrides), gpus, upstream=False).errors
                if p.rule_id == rule_id]
    assert expected and expected[0].key == key
    for auto in ([], ["-of", "auto"]):
        assert plan_offload.main([*argv, *auto, "--json"]) == 2
        said = json.loads(capsys.readouterr().out)
        assert said["ok"] is False and said["refused"] is True and said["unplanned"], said.get("unplanned")
        assert said["total_bytes_gpu"] == 0 and said["optimizer_params_per_rank"] == 0
        found = [p for p in said["problems"] if p["id"] == rule_id]
        assert found == [{"id": rule_id, "key": key, "value": expected[0].value, "rule": expected[0].rule,
                          "fix": expected[0].fix, "severity": "error"}], said["problems"]
    assert plan_offload.main(argv) == 2
    out = capsys.readouterr().out
    assert "not planned" in out and f"ERROR {key} = {expected[0].value}" in out and f"fix:  {expected[0].fix}" in out
