"""plan_offload.py: auto means what it means for run_recipe.py, refusing with the alternatives when
nothing fits (it used to plan fraction 1 then)."""

from __future__ import annotations

import json
import re

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
