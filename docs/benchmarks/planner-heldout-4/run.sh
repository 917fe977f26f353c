#!/usr/bin/env bash
# Held-out runs for the allocator's reserve as the loss's largest tensor (issue #15, sixteenth session): the plan's
# reserve is now at least the bf16 logits of a micro batch (the unfused cross entropy's fp32 copy) + 0.02 GiB, set on
# the two fraction-1 runs whose reserve was one logits tensor. These configurations make that term decide (fraction 1,
# 8192-16384 tokens a micro batch, the unfused loss, a 4B model, the MoE proxy) and none set or checked anything in
# the planner. Each case is one run_recipe.py training of 4 steps; cases in a wave run side by side (peak allocated
# and reserved are per process, NVML's device use too). Planned whole device / host peak (GiB): 4B 88.1 / 92.0 beside
# the 0.6B unfused 20.2 / 16.2; the 1.7B 46.4 / 41.4 beside the 1.1B proxy 41.2 / 28.5; the MoE proxy 30.2 / 46.4
# beside the 0.6B at 16384 tokens 47.1 / 16.2 and at fraction 0.9 27.6 / 16.2. Run from the repository root after
# the offline install:
#   bash docs/benchmarks/planner-heldout-4/run.sh WAVE [WAVE ...]   WAVE: CASE or CASE+CASE+...
# Results: $RUNS/planner-heldout-4/<case>/ (log.txt, whose first line is the command, metrics, summary).
source docs/benchmarks/case_runner.sh
offload() { echo "optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=$1 optimizer.overlap_cpu_optimizer_d2h_h2d=True"; }
run_case() {
  local case=$1 recipe overrides
  case $case in
    4b-sl4096-mb2-fraction-1) recipe=qwen3_4b_pretrain_config
                          overrides="model.tensor_model_parallel_size=1 $(sl 4096) $(mb 2) $(offload 1)" ;;
    0p6b-sl4096-unfused-loss-fraction-1) recipe=qwen3_0p6b_pretrain_config
                          overrides="$(sl 4096) $(mb 1) model.cross_entropy_loss_fusion=False $(offload 1)" ;;
    1p7b-sl8192-fraction-1) recipe=qwen3_1p7b_pretrain_config
                          overrides="$(sl 8192) $(mb 1) $(offload 1)" ;;
    1b-proxy-sl4096-mb3-fraction-1) recipe=qwen3_1b_proxy_pretrain_config
                          overrides="$(sl 4096) $(mb 3) $(offload 1)" ;;
    moe-proxy-2-sl8192-fraction-1) recipe=qwen3_30b_a3b_proxy_pretrain_config
                          overrides="model.num_layers=2 $(sl 8192) $(mb 1) $(offload 1)" ;;
    0p6b-sl16384-fraction-1) recipe=qwen3_0p6b_pretrain_config
                          overrides="$(sl 16384) $(mb 1) $(offload 1)" ;;
    0p6b-sl8192-fraction-0.9) recipe=qwen3_0p6b_pretrain_config
                          overrides="$(sl 8192) $(mb 1) $(offload 0.9)" ;;
    *) echo "unknown case $case"; return 2 ;;
  esac
  train_case "$case" "$runs/planner-heldout-4/$case" "$recipe" "$overrides"
}
run_side_by_side "$runs/planner-heldout-4" run_case 2 "$@"
