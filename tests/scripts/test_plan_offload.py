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
