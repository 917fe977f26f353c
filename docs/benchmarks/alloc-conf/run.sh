#!/usr/bin/env bash
# Twelfth session (issue #15): what PyTorch's allocator reserves once the recipes' expandable_segments:True is in
# effect (run_recipe applies it since this session; mbridge_offload/runtime/allocator_settings.py). Calibration
# cases (the planner's expandable-segments reserve is set on them): the dense 1.1B proxy at fractions 0 and 1 and
# the 4-layer MoE proxy at 0.5. Held-out cases (nothing is set on them): planner-heldout-2's, by its own run.sh.
# 4 steps each, side by side in waves that fit the GPU. Run from the repository root after the offline install:
#   bash docs/benchmarks/alloc-conf/run.sh WAVE [WAVE ...]     WAVE: CASE or CASE+CASE+...
# Results: $RUNS/alloc-conf/calibration/<case>/ and $RUNS/alloc-conf/heldout/<case>/ (log.txt, whose first line is
# the command, metrics, summary).
source docs/benchmarks/case_runner.sh
offload() { echo "optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=$1 optimizer.overlap_cpu_optimizer_d2h_h2d=True"; }
run_case() {
  local case=$1 recipe overrides
  case $case in
    1b-proxy-fraction-0) recipe=qwen3_1b_proxy_pretrain_config
                         overrides="optimizer.optimizer_cpu_offload=False optimizer.optimizer_offload_fraction=0" ;;
    1b-proxy-fraction-1) recipe=qwen3_1b_proxy_pretrain_config; overrides="$(offload 1)" ;;
    moe-proxy-4-fraction-0.5) recipe=qwen3_30b_a3b_proxy_pretrain_config
                         overrides="model.num_layers=4 $(offload 0.5)" ;;
    *)  # a held-out case of planner-heldout-2
        DEST=alloc-conf/heldout RUNS=$runs bash docs/benchmarks/planner-heldout-2/run.sh "$case"; return $? ;;
  esac
  train_case "$case" "$runs/alloc-conf/calibration/$case" "$recipe" "$overrides"
}
run_side_by_side "$runs/alloc-conf" run_case 2 "$@"
