#!/usr/bin/env bash
# Held-out runs of the eleventh session's activation model (issue #15): configurations no planner constant or term
# was set or checked on (the calibration runs: dense-1b-sweep, moe-proxy-sweep, moe-proxy-sweep-deep, oom-8b and the
# seventh session's planner-heldout/ and planner-auto/). Each case is one run_recipe.py training of 4 steps at one
# fraction; cases in a wave run side by side (peak allocated and reserved are per process, NVML's device use too;
# the host's RSS high water is per process, the node's peak is not). Run from the repository root after the
# offline install:  bash docs/benchmarks/planner-heldout-2/run.sh WAVE [WAVE ...]   WAVE: CASE or CASE+CASE+...
# Results: $RUNS/planner-heldout-2/<case>/ (log.txt, whose first line is the command, metrics, summary); DEST=folder
# puts them under $RUNS/folder/ instead (the same cases run again under another setting).
source docs/benchmarks/case_runner.sh
offload() { echo "optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=$1 optimizer.overlap_cpu_optimizer_d2h_h2d=$2"; }
none="optimizer.optimizer_cpu_offload=False optimizer.optimizer_offload_fraction=0"
run_case() {
  local case=$1 recipe overrides
  case $case in
    4b-sl2048)            recipe=qwen3_4b_pretrain_config
                          overrides="model.tensor_model_parallel_size=1 $(sl 2048) $(mb 1) $(offload 0.5 False)" ;;
    1p7b-sl2048-mb2-mlp-overlap) recipe=qwen3_1p7b_pretrain_config
                          overrides="$(sl 2048) $(mb 2) model.recompute_granularity=selective model.recompute_modules=[mlp] $(offload 0.5 True)" ;;
    1b-proxy-unfused-loss-sl4096) recipe=qwen3_1b_proxy_pretrain_config
                          overrides="$(sl 4096) $(mb 1) model.cross_entropy_loss_fusion=False $(offload 0.25 False)" ;;
    moe-proxy-5-moe-act)  recipe=qwen3_30b_a3b_proxy_pretrain_config
                          overrides="model.num_layers=5 $(sl 4096) $(mb 1) model.recompute_granularity=selective model.recompute_modules=[moe_act] $(offload 0.5 False)" ;;
    moe-proxy-2-fine-grained-sl8192) recipe=qwen3_30b_a3b_proxy_fine_grained_offload_config
                          overrides="model.num_layers=2 $(sl 8192) $(mb 1) $none" ;;
    0p6b-activation-offload-sl4096-mb2) recipe=qwen3_0p6b_activation_offload_config
                          overrides="$(sl 4096) $(mb 2) $none" ;;
    moe-proxy-6-sl4096-mb2-overlap) recipe=qwen3_30b_a3b_proxy_pretrain_config
                          overrides="model.num_layers=6 $(sl 4096) $(mb 2) $(offload 0.75 True)" ;;
    1p7b-sl8192-block4)   recipe=qwen3_1p7b_pretrain_config
                          overrides="$(sl 8192) $(mb 1) model.recompute_granularity=full model.recompute_method=block model.recompute_num_layers=4 $(offload 0.25 False)" ;;
    *) echo "unknown case $case"; return 2 ;;
  esac
  train_case "$case" "$runs/${DEST:-planner-heldout-2}/$case" "$recipe" "$overrides"
}
run_side_by_side "$runs/${DEST:-planner-heldout-2}" run_case 2 "$@"
