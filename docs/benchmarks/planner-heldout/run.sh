#!/usr/bin/env bash
# Held-out planner measurements on the H200 (issue #15): configurations no planner constant was fitted on
# (the calibration runs are dense-1b-sweep, moe-proxy-sweep, moe-proxy-sweep-deep, oom-8b), each run once at
# one fraction for 4 steps, one micro batch per step. Run from the repository root after the offline install:
#   bash docs/benchmarks/planner-heldout/run.sh WAVE [WAVE ...]      WAVE: CASE or CASE+CASE+... (side by side)
# Peak allocated and reserved memory are per process, so cases may share the GPU; the memory used outside
# PyTorch (CUDA context, workspaces, communicators) is read from the whole device when NVML cannot see the
# process, so the first wave runs one case alone. Results: $RUNS/planner-heldout/<case>/ (sweep.json, the run's
# metrics and log) and <case>.log.
source docs/benchmarks/case_runner.sh
full_uniform="model.recompute_granularity=full model.recompute_method=uniform model.recompute_num_layers=1"
run_case() {
  local case=$1 recipe fraction overrides
  case $case in
    0p6b-sl8192)          recipe=qwen3_0p6b_pretrain_config; fraction=0; overrides="$(sl 8192) $(mb 1)" ;;
    1p7b-sl4096-mb2)      recipe=qwen3_1p7b_pretrain_config; fraction=0.5; overrides="$(sl 4096) $(mb 2)" ;;
    1b-proxy-sl8192-full) recipe=qwen3_1b_proxy_pretrain_config; fraction=1; overrides="$(sl 8192) $(mb 1) $full_uniform" ;;
    moe-proxy-3)          recipe=qwen3_30b_a3b_proxy_pretrain_config; fraction=0.25; overrides="model.num_layers=3 $(mb 1)" ;;
    1p7b-sl8192-selective) recipe=qwen3_1p7b_pretrain_config; fraction=0
                          overrides="$(sl 8192) $(mb 1) model.recompute_granularity=selective model.recompute_modules=[layernorm,mlp]" ;;
    1p7b-activation-offload) recipe=qwen3_1p7b_pretrain_config; fraction=0.25
                          overrides="$(sl 4096) $(mb 1) model.cpu_offloading=True model.cpu_offloading_num_layers=16" ;;
    moe-proxy-3-fine-grained) recipe=qwen3_30b_a3b_proxy_fine_grained_offload_config; fraction=0.5
                          overrides="model.num_layers=3 $(mb 1)" ;;
    1b-proxy-sl4096-block8) recipe=qwen3_1b_proxy_pretrain_config; fraction=0
                          overrides="$(sl 4096) $(mb 2) model.recompute_granularity=full model.recompute_method=block model.recompute_num_layers=8" ;;
    moe-proxy-6-sl2048-mb2) recipe=qwen3_30b_a3b_proxy_pretrain_config; fraction=0.5
                          overrides="model.num_layers=6 $(sl 2048) $(mb 2)" ;;
    *) echo "unknown case $case"; return 2 ;;
  esac
  echo "=== $case $(date +%T)"
  # shellcheck disable=SC2086  (the overrides are words)
  $py scripts/sweep_offload.py --recipe "$recipe" --fractions "$fraction" --baseline-runs 1 \
    --out "$runs/planner-heldout/$case" train.train_iters=4 $overrides
  echo "=== $case done $(date +%T)"
}
run_side_by_side "$runs/planner-heldout" run_case 4 "$@"
