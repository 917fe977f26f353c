# Sourced by the benchmark scripts that run cases side by side on one GPU (planner-heldout*/run.sh,
# resume-parity/run.sh): their environment, override words, and running the cases.
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
runs=${RUNS:-/tmp/runs}
py=${PYTHON:-python3}
sl() { echo "model.seq_length=$1 dataset.seq_length=$1"; }  # sequence length
mb() { echo "train.micro_batch_size=$1 train.global_batch_size=$1"; }  # one micro batch of $1 per step

# run_side_by_side DIR FUNCTION LINES GROUP [GROUP ...]: for each GROUP (CASE or
# CASE+CASE+...), starts FUNCTION CASE for each of its cases at once, output to DIR/CASE.log, waits for all, then
# prints the last LINES lines of each log.
run_side_by_side() {
  local dir=$1 function=$2 lines=$3 group case; shift 3
  mkdir -p "$dir"
  for group in "$@"; do
    for case in ${group//+/ }; do
      "$function" "$case" > "$dir/$case.log" 2>&1 &
    done
    wait
    for case in ${group//+/ }; do tail -n "$lines" "$dir/$case.log"; done
  done
}

# train_case CASE OUT RECIPE OVERRIDES: one 4-step run_recipe.py training on one GPU into OUT, its command as the first
# line of OUT/log.txt and its output after it.
train_case() {
  local case=$1 out=$2 recipe=$3 overrides=$4 command
  command="$py scripts/run_recipe.py --recipe $recipe --num-gpus 1 --out $out train.train_iters=4 $overrides"
  mkdir -p "$out"
  echo "=== $case $(date +%T)"
  echo "$command" > "$out/log.txt"
  # shellcheck disable=SC2086  (the command is words)
  $command >> "$out/log.txt" 2>&1
  echo "=== $case exit $? $(date +%T)"
}
