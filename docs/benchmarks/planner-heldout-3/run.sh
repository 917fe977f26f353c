#!/usr/bin/env bash
# Held-out runs for the planner with expandable segments (issue #15): configurations no planner constant or term was
# set or checked on, and none run before, the host's blind check among them (the overlap on and off; Qwen3-8B).
# Each case is one run_recipe.py training of 4 steps at one fraction; cases in a wave run side by side (peak
# allocated and reserved are per process, NVML's device use too; the host's RSS high water is per process).
# Planned (thirteenth session, expandable segments): 8B 121.9 GiB GPU / 105.1 GiB host peak (alone); the 7-layer
# MoE proxy 72.8 / 59.3 beside the 1.7B with activation offload 43.8 / 31.2; the 4B 72.5 / 25.8 beside the 0.6B
# 26.5 / 16.2. Run from the repository root after the offline install:
#   bash docs/benchmarks/planner-heldout-3/run.sh WAVE [WAVE ...]   WAVE: CASE or CASE+CASE+...
# Results: $RUNS/planner-heldout-3/<case>/ (log.txt, whose first line is the command, metrics, summary).
source docs/benchmarks/case_runner.sh
offload() { echo "optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=$1 optimizer.overlap_cpu_optimizer_d2h_h2d=$2"; }
run_case() {
  local case=$1 recipe overrides
  case $case in
    8b-sl2048-overlap-off) recipe=qwen3_8b_pretrain_config
                          overrides="model.tensor_model_parallel_size=1 $(sl 2048) $(mb 1) $(offload 0.55 False)" ;;
    moe-proxy-7-sl2048-overlap-off) recipe=qwen3_30b_a3b_proxy_pretrain_config
                          overrides="model.num_layers=7 $(sl 2048) $(mb 1) $(offload 0.5 False)" ;;
    1p7b-activation-offload-sl4096-mb2-overlap-on) recipe=qwen3_1p7b_activation_offload_config
                          overrides="$(sl 4096) $(mb 2) $(offload 0.5 True)" ;;
    4b-sl4096-mlp-overlap-on) recipe=qwen3_4b_pretrain_config
                          overrides="model.tensor_model_parallel_size=1 $(sl 4096) $(mb 1) model.recompute_granularity=selective model.recompute_modules=[mlp] $(offload 0.25 True)" ;;
    0p6b-sl8192-fraction-1-overlap-on) recipe=qwen3_0p6b_pretrain_config
                          overrides="$(sl 8192) $(mb 1) $(offload 1 True)" ;;
    *) echo "unknown case $case"; return 2 ;;
  esac
  train_case "$case" "$runs/planner-heldout-3/$case" "$recipe" "$overrides"
}
run_side_by_side "$runs/planner-heldout-3" run_case 2 "$@"
