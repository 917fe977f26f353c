#!/usr/bin/env bash
# The exact commands behind the numbers in docs/benchmarks/, run on the project's H200 host
# (1 GPU, 16 cores, 125 GiB host RAM) from the repository root, after the offline install bundle
# (../shared/gpu/README.md). Usage: bash docs/benchmarks/h200.sh PHASE [PHASE ...]
# Each phase writes under $RUNS (default /tmp/runs) and, when $OUT is set, a PHASE.tgz there.
set -uo pipefail
runs=${RUNS:-/tmp/runs}
export PYTHONUNBUFFERED=1
# The host's python3 has the stack but not this project installed (no venv): the packages import from
# the repository root (scripts/ no longer put it on sys.path; the runs a sweep starts inherit this).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}
mkdir -p "$runs"
# The host figures for the floor: phase host's when it ran on this machine, else the recorded ones (same host kind).
# One deterministic run of the dense proxy in folder $d (the engine's parity phases), side by side with others.
parity_run() {  # NAME RUN_RECIPE_ARGS...
  local name=$1; shift
  $py scripts/run_recipe.py --recipe qwen3_1b_proxy_pretrain_config --deterministic --cpu-threads 3 \
    --out "$d/$name" train.train_iters=${STEPS:-50} "$@" > "$d/$name.log" 2>&1
  echo "$name: exit $? ($(tail -n 1 "$d/$name/failure.json" 2>/dev/null || echo ok))"
}
stream_parity() {  # DIR [PYTEST_ARGS...]: the stream mode against no offload, 50 deterministic steps at fractions
  # 1 and 0.25, a save at step 3 resumed to 6 (2-layer proxy), and the engine's GPU tests beside them
  d=$1; shift; mkdir -p "$d"
  $py -m pytest tests/runtime/test_gpu_engine.py "$@" -v -p no:cacheprovider > "$d/gpu-tests.log" 2>&1 &
  parity_run baseline optimizer.optimizer_cpu_offload=False optimizer.optimizer_offload_fraction=0 &
  parity_run stream-1 --offload-engine stream optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=1 &
  parity_run stream-0.25 --offload-engine stream optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=0.25 &
  $py scripts/check_resume.py --recipe qwen3_1b_proxy_pretrain_config --fractions 1 --save-at 3 --deterministic \
    --out "$d/resume-stream" model.num_layers=2 +env_vars.MBRIDGE_OFFLOAD_ENGINE=stream > "$d/resume-stream.log" 2>&1 &
  wait
  tail -n 15 "$d/gpu-tests.log"
  grep -h "^stream offload engine: " "$d"/stream-*.log  # what the engine offloaded (printed since the tenth session)
  $py -m mbridge_offload.bench.engine_parity --out "$d" "stream (1) vs no offload=$d/baseline:$d/stream-1" \
    "stream (0.25) vs no offload=$d/baseline:$d/stream-0.25"
}
auto_pair() {  # DIR CASE "DEVICE_GIB RECIPE OVERRIDES...": scripts/check_auto.py on one case (micro batch 1 unless given)
  local dir=$1 case=$2 args=$3 words
  case $args in *micro_batch_size*) ;; *) args="$args train.micro_batch_size=1 train.global_batch_size=1" ;; esac
  read -r -a words <<< "$args"
  $py scripts/check_auto.py --recipe "${words[1]}" --device-gib "${words[0]}" --out "$dir/$case" "${words[@]:2}" 2>&1 \
    | tee "$dir/$case.log"
}
profiled_run() {  # NAME RUN_RECIPE_ARGS...: the dense proxy for 13 steps in folder $d, PyTorch's profiler on steps 10-12
  # (Megatron Bridge's schedule: step 9 warms up, 10-11 are traced), read by mbridge_offload.bench.gpu_trace into
  # $d/NAME-gpu_trace.md; the trace itself is not kept
  local name=$1; shift
  $py scripts/run_recipe.py --recipe qwen3_1b_proxy_pretrain_config --out "$d/$name" train.train_iters=13 \
    profiling.use_pytorch_profiler=True profiling.profile_step_start=10 profiling.profile_step_end=12 "$@" \
    > "$d/$name.log" 2>&1; echo "$name: exit $?"
  $py -m mbridge_offload.bench.gpu_trace "$d/$name/torch_profile/rank-0.json.gz" --out "$d/$name-gpu_trace.md"
  rm -rf "$d/$name/torch_profile"
}
engine_gpu_test_and_bench() {  # in folder $d: the engine's GPU test (exact bit-identical to the library's offloaded
  # path over 8 steps, delayed trains), then delayed and exact at fraction 1 against their own baselines, 3 rounds
  # interleaved, 33 steps each (resumed where a cut call left it)
  [ -f "$d/gpu-tests.log" ] || $py -m pytest tests/runtime/test_gpu_engine.py -k exact_engine -v \
    -p no:cacheprovider > "$d/gpu-tests.log" 2>&1
  tail -n 4 "$d/gpu-tests.log"
  $py scripts/bench_offload.py --recipe qwen3_1b_proxy_pretrain_config --out "$d/bench" --resume \
    --host-json "$(host_json)" --fractions 1 --configs engine-delayed,engine-exact --repeats 3 --baseline-runs 3 \
    train.train_iters=33
}
host_json() { if [ -f "$runs/host/host.json" ]; then echo "$runs/host/host.json"; else echo docs/benchmarks/offload-overhead/host.json; fi; }
save_phase() {  # PHASE: its folders under $RUNS as $OUT/PHASE.tgz (also when the call's time limit interrupts it)
  if [ -n "${OUT:-}" ]; then
    tar czf "$OUT/$1.tgz" -C "$runs" --exclude='tb' $(cd "$runs" && ls -d "$1"* 2>/dev/null) 2>/dev/null || true
  fi
}
snapshot_run() {  # PHASE NAME RECIPE TOKENS MICRO_BATCH FRACTION [OVERRIDES...]: one run on the whole device with the
  # allocator's history of steps 1-2 (run_recipe --memory-snapshot) and NCCL's INIT lines, under $runs/PHASE/NAME; the
  # history comes back gzipped in $OUT (a device call returns files of up to 16 MiB) beside torch's `stats` summary
  local phase=$1 name=$2 recipe=$3 tokens=$4 micro=$5 fraction=$6 d=$runs/$1 history
  shift 6
  mkdir -p "$d"
  # NCCL's lines carry the epoch time to the microsecond (since the twenty-first session): reserve-snapshot/holes.py
  # places each communicator's creation on the history's clock with it
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT NCCL_DEBUG_TIMESTAMP_LEVELS=INFO,WARN NCCL_DEBUG_TIMESTAMP_FORMAT='[%s.%6f] ' \
    $py scripts/run_recipe.py --recipe "$recipe" --num-gpus 1 \
    --out "$d/$name" --memory-snapshot 2 model.seq_length=$tokens dataset.seq_length=$tokens \
    train.micro_batch_size=$micro train.global_batch_size=$micro optimizer.optimizer_cpu_offload=True \
    optimizer.optimizer_offload_fraction=$fraction train.train_iters=3 "$@" > "$d/$name.log" 2>&1
  echo "$name: exit $?"; grep -h "^memory snapshot:" "$d/$name.log"
  history=$d/$name/memory_snapshot.rank0.pickle
  if [ -f "$history" ]; then
    $py -m torch.cuda._memory_viz stats "$history" > "$d/$name/segments.txt" 2>&1
    gzip -9 "$history" && mv "$history.gz" "${OUT:-$d}/$phase-$name.pickle.gz"
  fi
}
# the twelfth session lost an interrupted bench's finished runs with the machine: keep what a cut phase has
trap 'echo "=== ${phase:-?} interrupted"; save_phase "${phase:-none}"; exit 130' INT TERM
for phase in "$@"; do
  start=$(date +%s)
  echo "=== $phase"
  case $phase in
    smoke)
      $py scripts/run_recipe.py --recipe qwen3_1b_proxy_optimizer_offload_config --out "$runs/smoke" \
        model.num_layers=4 train.train_iters=6 ;;
    dense-sweep)
      $py scripts/sweep_offload.py --recipe qwen3_1b_proxy_pretrain_config --fractions 0,0.25,0.5,0.75,1 \
        --out "$runs/dense-sweep" train.train_iters=12 optimizer.overlap_cpu_optimizer_d2h_h2d=True ;;
    moe-sweep)
      $py scripts/sweep_offload.py --recipe qwen3_30b_a3b_proxy_pretrain_config --fractions 0,0.25,0.5,0.75,1 \
        --out "$runs/moe-sweep" train.train_iters=8 ;;
    moe-sweep-deep)
      # 8 layers (5.6B parameters): the deepest whose whole sweep the planner of the time fitted on this host
      # (~100 GiB at 1.0 between steps). One baseline: the 4-layer sweep measured the noise floor (0.0003).
      # Third session: fractions 0-0.75 ran (docs/benchmarks/moe-proxy-sweep-deep/). Fourth session: the
      # finished runs were copied in and kept (--resume; the overlap kept off as that tuning set it) and
      # fraction 1 ran: killed by the host in its first optimizer step (docs/benchmarks/host-peak/). The
      # planner now counts that peak, so fraction 1 is refused before launch (its row says so).
      [ -d "$runs/moe-sweep-deep" ] || cp -r docs/benchmarks/moe-proxy-sweep-deep "$runs/moe-sweep-deep"
      $py scripts/sweep_offload.py --recipe qwen3_30b_a3b_proxy_pretrain_config --fractions 0,0.25,0.5,0.75,1 \
        --out "$runs/moe-sweep-deep" --resume --baseline-runs 1 model.num_layers=8 train.train_iters=8 \
        optimizer.overlap_cpu_optimizer_d2h_h2d=False ;;
    activation)
      for n in 4 8 15; do
        $py scripts/run_recipe.py --recipe qwen3_1b_proxy_activation_offload_config --out "$runs/activation-$n" \
          model.cpu_offloading_num_layers=$n train.train_iters=12
      done ;;
    fine-grained)
      $py scripts/run_recipe.py --recipe qwen3_30b_a3b_proxy_fine_grained_offload_config --out "$runs/fine-grained" \
        train.train_iters=8 ;;
    oom)
      $py scripts/sweep_offload.py --recipe qwen3_8b_pretrain_config --num-gpus 1 --fractions 0,0.5 --baseline-runs 1 \
        --out "$runs/oom-8b" model.tensor_model_parallel_size=1 model.seq_length=2048 dataset.seq_length=2048 \
        train.global_batch_size=2 train.train_iters=4 optimizer.overlap_cpu_optimizer_d2h_h2d=True ;;
    smoke-torchrun)
      # The launcher path (torchrun started us), with optimizer offload and the per-step breakdown.
      $py -m torch.distributed.run --standalone --nproc-per-node 1 scripts/run_recipe.py \
        --recipe qwen3_1b_proxy_optimizer_offload_config --out "$runs/smoke-torchrun" model.num_layers=4 train.train_iters=6 ;;
    host)
      $py scripts/measure_host.py --json "$runs/host/host.json" ;;
    host-concurrent)
      # Third session (docs/benchmarks/offload-overhead/host-concurrent/): the host figures with the copies
      # beside the cores' work, then three more samples of that part alone.
      mkdir -p "$runs/host-concurrent"
      $py scripts/measure_host.py --json "$runs/host-concurrent/host.json"
      $py -c "import json
from mbridge_offload.bench.host_measure import copies_beside_cpu_work
for i in range(3): print(json.dumps({k: (v if isinstance(v, bool) else round(v, 2)) for k, v in copies_beside_cpu_work().items()}))" \
        > "$runs/host-concurrent/copies-beside-cpu-work.jsonl" ;;
    host-peak)
      # Fourth session (docs/benchmarks/host-peak/): the node's memory, sampled once a second, while the MoE
      # proxy trains at fraction 1 with 8 layers (killed by the host then; the guard now refuses it before
      # launch, exit 2) and 7 layers (trains). The session ran these as two calls (the README has them).
      # Twentieth session, from the tree of commit 17e0846, alone on the node (221 s): host-peak/alone-on-the-node/.
      mkdir -p "$runs/host-peak"
      for n in 8 7; do
        (while true; do echo "$(date +%s) $(awk '/MemAvailable|Shmem:|Cached:/{printf "%s%s ", $1, $2}' /proc/meminfo) rss=$(ps -C python3 -o rss= | awk '{s+=$1} END {print s}')"; sleep 1; done) > "$runs/host-peak/mem$n.txt" &
        sampler=$!
        timeout -s INT 250 $py scripts/run_recipe.py --recipe qwen3_30b_a3b_proxy_pretrain_config --out "$runs/host-peak/trace$n" \
          model.num_layers=$n train.train_iters=3 optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=1 \
          optimizer.overlap_cpu_optimizer_d2h_h2d=False > "$runs/host-peak/trace$n.log" 2>&1
        echo "layers $n: exit $?"; kill $sampler
        sleep 20  # a killed run's pinned memory takes seconds to come back; the next launch checks what is free
      done ;;
    bench-dense)
      # Second session: stock (all cores, 1 thread), overlap on, and the tuning of the time (= stock all
      # cores) at 0.25/0.5/0.75/1 on the ~1.1B dense proxy; floor from phase host. Ran with
      # --configs stock-all-cores,stock-1-thread,overlap-on,tuned (docs/benchmarks/offload-overhead/dense-1b/).
      $py scripts/bench_offload.py --recipe qwen3_1b_proxy_pretrain_config --out "$runs/bench-dense" --resume \
        --host-json "$runs/host/host.json" --configs stock-all-cores,stock-1-thread,overlap-on --repeats 1 --baseline-runs 2 --short-runs train.train_iters=10 ;;
    bench-chunked)
      # Third session (docs/benchmarks/offload-overhead/dense-1b-chunked/): overlap in 8 chunks
      # (mbridge_offload/runtime/chunked_overlap.py) against stock and per-tensor overlap at 100% on the dense proxy, all
      # in one session (own baseline).
      $py scripts/bench_offload.py --recipe qwen3_1b_proxy_pretrain_config --out "$runs/bench-chunked" --resume \
        --host-json "$(host_json)" --fractions 1 --baseline-runs 1 \
        --configs stock-all-cores,overlap-on,overlap-chunked --repeats 1 --short-runs train.train_iters=10 ;;
    bench-dense-tuned)
      # Fourth session (docs/benchmarks/offload-overhead/dense-1b-tuned/): the current tuning (overlap in
      # 8 chunks; tuned reuses the overlap-chunked run with one rank) against stock at 0.25/0.5/0.75 on
      # the dense proxy, two baselines for the step-time spread.
      $py scripts/bench_offload.py --recipe qwen3_1b_proxy_pretrain_config --out "$runs/bench-dense-tuned" --resume \
        --host-json "$(host_json)" --fractions 0.25,0.5,0.75 --configs stock-all-cores,overlap-chunked,tuned \
        --repeats 1 --baseline-runs 2 --short-runs train.train_iters=10 ;;
    bench-dense-repeats)
      # NOT RUN YET. Whether the chunked tuning changes the whole step at 25% and 50%, past the run-to-run
      # spread that table 4 met (identical baselines 31% apart): three interleaved rounds (~10 min).
      $py scripts/bench_offload.py --recipe qwen3_1b_proxy_pretrain_config --out "$runs/bench-dense-repeats" --resume \
        --host-json "$(host_json)" --fractions 0.25,0.5 --configs stock-all-cores,overlap-chunked,tuned --repeats 3 \
        --baseline-runs 3 train.train_iters=33 ;;
    bench-moe)
      # Second session (docs/benchmarks/offload-overhead/moe-proxy/): the configurations of the time on the
      # Qwen3-30B-A3B proxy (4 layers, 128 experts), fraction 1 only (device time).
      $py scripts/bench_offload.py --recipe qwen3_30b_a3b_proxy_pretrain_config --out "$runs/bench-moe" --resume \
        --host-json "$runs/host/host.json" --fractions 1 --configs stock-all-cores,overlap-on --baseline-runs 1 \
        --repeats 1 --short-runs train.train_iters=6 ;;
    bench-moe-tuned)
      # Fourth session (docs/benchmarks/offload-overhead/moe-proxy-tuned/): the current tuning against
      # stock on the MoE proxy at 0.25 and 1, 10 steps (the 6-step runs had not reached steady state).
      $py scripts/bench_offload.py --recipe qwen3_30b_a3b_proxy_pretrain_config --out "$runs/bench-moe-tuned" \
        --resume --host-json "$(host_json)" --fractions 0.25,1 --configs stock-all-cores,overlap-chunked,tuned \
        --baseline-runs 1 --repeats 1 --short-runs train.train_iters=10 ;;
    gpu-tests)
      $py -m pytest tests/runtime/test_gpu_training.py tests/runtime/test_gpu_resume.py tests/runtime/test_gpu_auto.py tests/runtime/test_gpu_engine.py \
        -v -p no:cacheprovider 2>&1 \
        | tee "$runs/gpu-tests.log" ;;
    planner-heldout)
      # Seventh session (issue #15): one case alone (the device's memory outside PyTorch is then this run's),
      # then the rest side by side in waves that fit the GPU, beside the resume-parity parts and the GPU tests.
      RUNS=$runs bash docs/benchmarks/planner-heldout/run.sh ${WAVES:-0p6b-sl8192 \
        1p7b-sl4096-mb2+1b-proxy-sl8192-full 1p7b-activation-offload+moe-proxy-3 \
        1p7b-sl8192-selective+1b-proxy-sl4096-block8 moe-proxy-3-fine-grained+moe-proxy-6-sl2048-mb2} ;;
    planner-auto)
      # Seventh session (issue #15): auto on GPUs of other sizes (a ballast process leaves exactly that much
      # free), configurations no planner constant was fitted on; each pair alone on the GPU. Ran as
      # CASES="1p7b-sl2048 0p6b-sl4096-mb2 moe-proxy-2-sl8192" (docs/benchmarks/planner-auto/: the MoE pair is not
      # valid, see its README); moe-proxy-4-sl2048 and the GPU test (gpu-tests) have not run.
      auto_case() {  # NAME DEVICE_GIB RECIPE OVERRIDES...
        local name=$1 device=$2 recipe=$3; shift 3
        $py scripts/check_auto.py --recipe "$recipe" --device-gib "$device" --out "$runs/planner-auto/$name" "$@" \
          train.micro_batch_size=${MB:-1} train.global_batch_size=${MB:-1}
      }
      mkdir -p "$runs/planner-auto"
      for case in ${CASES:-1p7b-sl2048 0p6b-sl4096-mb2 moe-proxy-2-sl8192 moe-proxy-4-sl2048}; do
        case $case in
          1p7b-sl2048) auto_case $case 32 qwen3_1p7b_pretrain_config model.seq_length=2048 dataset.seq_length=2048 ;;
          0p6b-sl4096-mb2) MB=2 auto_case $case 29 qwen3_0p6b_pretrain_config model.seq_length=4096 dataset.seq_length=4096 ;;
          moe-proxy-2-sl8192) auto_case $case 36 qwen3_30b_a3b_proxy_pretrain_config model.num_layers=2 \
            model.seq_length=8192 dataset.seq_length=8192 ;;
          moe-proxy-4-sl2048) auto_case $case 48 qwen3_30b_a3b_proxy_pretrain_config model.num_layers=4 \
            model.seq_length=2048 dataset.seq_length=2048 ;;
          *) echo "unknown case $case"; exit 2 ;;
        esac 2>&1 | tee "$runs/planner-auto/$case.log"
      done ;;
    planner-heldout-2)
      # Eleventh session (issue #15, docs/benchmarks/planner-heldout-2/): the activation model read from the layers'
      # code, on configurations nothing in the planner was set or checked on, side by side in waves that fit the GPU.
      RUNS=$runs bash docs/benchmarks/planner-heldout-2/run.sh ${WAVES:-4b-sl2048+1p7b-sl2048-mb2-mlp-overlap+1b-proxy-unfused-loss-sl4096 \
        moe-proxy-5-moe-act+moe-proxy-2-fine-grained-sl8192+0p6b-activation-offload-sl4096-mb2 \
        moe-proxy-6-sl4096-mb2-overlap+1p7b-sl8192-block4} ;;
    planner-auto-2)
      # Eleventh session (issue #15, docs/benchmarks/planner-auto-2/): planner-auto with the eleventh session's
      # planner (activation model, reserve, memory outside PyTorch), on configurations none of it was set on.
      mkdir -p "$runs/planner-auto-2"
      for case in ${CASES:-1p7b-sl4096 moe-proxy-4-sl2048 1b-proxy-sl4096-mb2-selective moe-proxy-2-sl8192 0p6b-sl8192-full}; do
        case $case in
          1p7b-sl4096) args="40 qwen3_1p7b_pretrain_config model.seq_length=4096 dataset.seq_length=4096" ;;
          moe-proxy-4-sl2048) args="48 qwen3_30b_a3b_proxy_pretrain_config model.num_layers=4 model.seq_length=2048 dataset.seq_length=2048" ;;
          1b-proxy-sl4096-mb2-selective) args="28 qwen3_1b_proxy_pretrain_config model.seq_length=4096 dataset.seq_length=4096 \
            train.micro_batch_size=2 train.global_batch_size=2 model.recompute_granularity=selective model.recompute_modules=[mlp]" ;;
          moe-proxy-2-sl8192) args="36 qwen3_30b_a3b_proxy_pretrain_config model.num_layers=2 model.seq_length=8192 dataset.seq_length=8192" ;;
          0p6b-sl8192-full) args="16 qwen3_0p6b_pretrain_config model.seq_length=8192 dataset.seq_length=8192 \
            model.recompute_granularity=full model.recompute_method=uniform model.recompute_num_layers=2" ;;
          *) echo "unknown case $case"; exit 2 ;;
        esac
        auto_pair "$runs/planner-auto-2" "$case" "$args"
      done ;;
    engine-parity)
      # Eighth session (issue #16, docs/benchmarks/offload-engine/): 50 deterministic steps of the dense proxy
      # without offload, with the library's offloaded step (tuned) and with the engine's exact and delayed modes,
      # all at fraction 1, side by side (parity, not speed: 3 CPU threads each, so the host's cores are shared).
      d="$runs/engine-parity"; mkdir -p "$d"
      parity_run baseline optimizer.optimizer_cpu_offload=False optimizer.optimizer_offload_fraction=0 &
      parity_run library-1 optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=1 &
      parity_run exact-1 --offload-engine exact optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=1 &
      parity_run delayed-1 --offload-engine delayed optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=1 &
      # save at step 3, resume to 6, with the exact engine (2-layer proxy), against the uninterrupted run
      $py scripts/check_resume.py --recipe qwen3_1b_proxy_pretrain_config --fractions 1 --save-at 3 --deterministic \
        --out "$d/resume-exact" model.num_layers=2 +env_vars.MBRIDGE_OFFLOAD_ENGINE=exact > "$d/resume-exact.log" 2>&1 &
      wait
      $py -m mbridge_offload.bench.engine_parity --out "$d" "exact vs library (1)=$d/library-1:$d/exact-1" \
        "exact (1) vs no offload=$d/baseline:$d/exact-1" "library (1) vs no offload=$d/baseline:$d/library-1" \
        "delayed (1) vs no offload=$d/baseline:$d/delayed-1" ;;
    engine-bench)
      # Eighth session (issue #16, docs/benchmarks/offload-engine/bench-dense-1/): the engine against the library's
      # tuned step and its own baseline, 3 rounds interleaved, 33 steps each (the first 3 excluded: 30 measured),
      # fraction 1. Ran in two device calls (--resume); the 12th run (delayed, round 3) did not finish in the
      # session's device time. The table was then assembled on the CPU machine with the same command and
      # --out docs/benchmarks/offload-engine/bench-dense-1 (every run kept).
      $py scripts/bench_offload.py --recipe qwen3_1b_proxy_pretrain_config --out "$runs/engine-bench" --resume \
        --host-json "$(host_json)" --fractions 1 --configs tuned,engine-exact,engine-delayed --repeats 3 \
        --baseline-runs 3 train.train_iters=33 ;;
    engine-bench-25)
      # NOT RUN YET (no device time left in the eighth session): the 25% goal.
      $py scripts/bench_offload.py --recipe qwen3_1b_proxy_pretrain_config --out "$runs/engine-bench-25" --resume \
        --host-json "$(host_json)" --fractions 0.25 --configs engine-exact --repeats 3 --baseline-runs 3 \
        train.train_iters=33 ;;
    engine-stream-parity)
      # Ninth session (issue #16, docs/benchmarks/offload-engine/stream-parity/): the stream mode against no
      # offload, 50 deterministic steps at fractions 1 and 0.25, side by side (parity, not speed), with a save at
      # step 3 resumed to 6 (2-layer proxy) and the engine's GPU tests beside them. Ran in one device call (337 s).
      stream_parity "$runs/engine-stream-parity" ;;
    engine-stream-bench)
      # Ninth session (issue #16, docs/benchmarks/offload-engine/bench-stream/): the stream mode at fractions 0.25
      # and 1 against its own baseline, 3 rounds interleaved, 33 steps each (30 measured). Ran in two device calls
      # (--resume); the table was then assembled on the CPU machine with the same command and
      # --out docs/benchmarks/offload-engine/bench-stream (every run kept).
      $py scripts/bench_offload.py --recipe qwen3_1b_proxy_pretrain_config --out "$runs/engine-stream-bench" --resume \
        --host-json "$(host_json)" --fractions 0.25,1 --configs engine-stream --repeats 3 --baseline-runs 3 \
        train.train_iters=33 ;;
    engine-stream-moe)
      # Ninth session (issue #16, docs/benchmarks/offload-engine/stream-moe-8/): the 8-layer MoE proxy (5.6B
      # parameters) at fraction 1 with the stream mode, which the library's path cannot run on this host. Ran with
      # STEPS=6 before the moments were kept out of forked processes: killed by the host as training began.
      $py scripts/run_recipe.py --recipe qwen3_30b_a3b_proxy_pretrain_config --offload-engine stream \
        --out "$runs/engine-stream-moe/stream-1" model.num_layers=8 train.train_iters=${STEPS:-10} \
        optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=1 ;;
    stream-last-parity)
      # Tenth session (issue #16, docs/benchmarks/offload-engine/stream-last/): the stream mode after two changes,
      # against no offload: it offloads the tensors the forward uses last (its own walk, not the library's) and
      # fetches the next update's first chunks during the forward. 50 deterministic steps each, a save at step 3
      # resumed to 6 (2-layer proxy), and the stream GPU test beside them. Ran in the install's call (184 s).
      stream_parity "$runs/stream-last-parity" -k stream ;;
    stream-last-bench)
      # Tenth session (issue #16, docs/benchmarks/offload-engine/bench-stream-last/): engine-stream-bench again
      # after the two changes above, and the host's peak after the moments were kept out of forked processes.
      $py scripts/bench_offload.py --recipe qwen3_1b_proxy_pretrain_config --out "$runs/stream-last-bench" --resume \
        --host-json "$(host_json)" --fractions 0.25,1 --configs engine-stream --repeats 3 --baseline-runs 3 \
        train.train_iters=33 ;;
    stream-moe-pair)
      # Tenth session (issue #16, docs/benchmarks/offload-engine/stream-moe-8/): the 8-layer MoE proxy without
      # offload, then with the stream mode at fraction 1 again, right after engine-stream-moe (STEPS=10): one
      # stream run on each side of the baseline, 10 steps each (3 warm-up excluded).
      mkdir -p "$runs/stream-moe-pair"
      for run in baseline stream-1-again; do
        case $run in baseline) offload="optimizer.optimizer_cpu_offload=False optimizer.optimizer_offload_fraction=0" ;;
          *) offload="--offload-engine stream optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=1" ;; esac
        $py scripts/run_recipe.py --recipe qwen3_30b_a3b_proxy_pretrain_config --out "$runs/stream-moe-pair/$run" \
          model.num_layers=8 train.train_iters=${STEPS:-10} $offload > "$runs/stream-moe-pair/$run.log" 2>&1
        echo "$run: exit $?"; tail -n 10 "$runs/stream-moe-pair/$run.log"
      done ;;
    stream-overhead)
      # NOT RUN (issue #16): where the stream mode's 25% cost comes from. Fraction 0.05 moves a fifth of 0.25's
      # bytes with the same 32 chunks and hooks: about the same slowdown says a fixed cost per step, a fifth of it
      # says the copies. 3 rounds, 33 steps each, ~10 min. The eleventh session's stream-chunks-bench answered the
      # first half without it (the training thread: 3.5 ms of ~35 ms); this would still size the copies' share.
      $py scripts/bench_offload.py --recipe qwen3_1b_proxy_pretrain_config --out "$runs/stream-overhead" --resume \
        --host-json "$(host_json)" --fractions 0.05,0.25 --configs engine-stream --repeats 3 --baseline-runs 3 \
        train.train_iters=33 ;;
    stream-chunks-bench)
      # Eleventh session (issue #16, docs/benchmarks/offload-engine/bench-stream-chunks/): the stream mode at 25% with
      # chunks of a fixed size (32M elements: 9 chunks here instead of 32), 3 rounds interleaved with their
      # baselines, 33 steps each; engine_step_s says the training thread's time in the step. Ran at commit 6a7cf4d
      # (that rule; reverted in the next commit: no faster, a larger ring): check it out to run it again.
      $py scripts/bench_offload.py --recipe qwen3_1b_proxy_pretrain_config --out "$runs/stream-chunks-bench" --resume \
        --host-json "$(host_json)" --fractions 0.25 --configs engine-stream --repeats 3 --baseline-runs 3 \
        train.train_iters=33 ;;
    stream-moe-bench)
      # Sixteenth session (issue #16, docs/benchmarks/offload-engine/bench-stream-moe/, at commit b71a6f0): the MoE
      # proxy's speed with the stream mode, 3 rounds interleaved, 33 steps each, LAYERS=4, in two device calls
      # (--resume; 83-145 s a run). Its identical baselines differed by 41.7 %: the proxy's routing, and with it its
      # step time, diverges between non-deterministic runs. DETERMINISTIC=1 adds --deterministic: the eighteenth
      # session ran DETERMINISTIC=1 LAYERS=4 from the tree of commit dda1b64, in two device calls (the first cut by
      # the call's limit during run 6/6, the second resumed it; 80-131 s a run), committed as
      # docs/benchmarks/offload-engine/bench-stream-moe-deterministic/.
      $py scripts/bench_offload.py --recipe qwen3_30b_a3b_proxy_pretrain_config \
        --out "$runs/stream-moe-bench${DETERMINISTIC:+-deterministic}" ${DETERMINISTIC:+--deterministic} --resume \
        --host-json "$(host_json)" --fractions 1 --configs engine-stream --repeats 3 --baseline-runs 3 \
        model.num_layers=${LAYERS:-4} train.train_iters=33 ;;
    stream-fetch-ahead)
      # Twenty-seventh session (issue #16, offload-engine/stream-fetch-ahead/, one H100, three calls, 85-132 s a run,
      # from the tree of commit d3600d3): the stream mode's fetch-ahead (runtime/fetch_ahead.py, opt-in) on the 4-layer
      # MoE proxy at fraction 1, deterministic, against stream without it and the baseline, 3 rounds interleaved, 33
      # steps each. It read: losses bit-identical, peak_allocated_gib equal to stream's, peak_reserved_gib 2.9 GiB
      # above it (the buffers), no step-time gain resolved (1.44x against 1.41x).
      $py scripts/bench_offload.py --recipe qwen3_30b_a3b_proxy_pretrain_config --out "$runs/stream-fetch-ahead" \
        --deterministic --resume --host-json "$(host_json)" --fractions 1 \
        --configs engine-stream,engine-stream-fetch-ahead --repeats 3 --baseline-runs 3 model.num_layers=4 \
        train.train_iters=33 ;;
    stream-bf16-moments)
      # Twenty-eighth session (issue #16, offload-engine/stream-bf16-moments/, design section 9.4): the stream mode with
      # Adam's moments in bf16 on the host and in the ring (MBRIDGE_OFFLOAD_STREAM_MOMENTS=bf16, opt-in) on the 4-layer
      # MoE proxy at fraction 1, deterministic, against stream with fp32 moments and the baseline, 3 rounds
      # interleaved, 33 steps each (as stream-fetch-ahead). Its GPU tests run first: the installed Transformer
      # Engine's FusedAdam with bf16 moments against fp32 AdamW on the rounded moments, and the dense proxy's 8 steps
      # within the seed's loss parity. It reads the step time against the opt-in modes' 1.10x (the exact mode's is
      # 1.30x), the loss delta against the
      # seed's 0.001 (bf16 is not bit-identical), the peak allocated (the ring is half) and the host per offloaded
      # parameter.
      mkdir -p "$runs/stream-bf16-moments"
      [ -f "$runs/stream-bf16-moments/gpu-tests.log" ] || $py -m pytest tests/runtime/test_gpu_engine.py -k bf16 -v \
        -p no:cacheprovider > "$runs/stream-bf16-moments/gpu-tests.log" 2>&1
      tail -n 6 "$runs/stream-bf16-moments/gpu-tests.log"
      $py scripts/bench_offload.py --recipe qwen3_30b_a3b_proxy_pretrain_config --out "$runs/stream-bf16-moments" \
        --deterministic --resume --host-json "$(host_json)" --fractions 1 \
        --configs engine-stream,engine-stream-bf16-moments --repeats 3 --baseline-runs 3 model.num_layers=4 \
        train.train_iters=33 ;;
    stream-bf16-parity50)
      # Twenty-eighth session (issue #16, offload-engine/stream-bf16-moments/parity50/, right after stream-bf16-moments'
      # first call): the dense 1.1B proxy's loss over 50 deterministic steps, no offload against stream with fp32 and
      # with bf16 moments at fraction 1, the three side by side on the one GPU (not a speed figure), and the kernel's
      # GPU test beside them.
      d="$runs/stream-bf16-parity50"; mkdir -p "$d"
      $py -m pytest tests/runtime/test_gpu_engine.py -k fused_adam_with_bf16 -v -p no:cacheprovider \
        > "$d/kernel-test.log" 2>&1 &
      parity_run baseline optimizer.optimizer_cpu_offload=False optimizer.optimizer_offload_fraction=0 &
      parity_run stream-1 --offload-engine stream optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=1 &
      parity_run stream-bf16-1 --offload-engine stream optimizer.optimizer_cpu_offload=True \
        optimizer.optimizer_offload_fraction=1 ++env_vars.MBRIDGE_OFFLOAD_STREAM_MOMENTS=bf16 &
      wait
      $py -m mbridge_offload.bench.engine_parity --out "$d" "stream fp32 (1) vs no offload=$d/baseline:$d/stream-1" \
        "stream bf16 moments (1) vs no offload=$d/baseline:$d/stream-bf16-1" ;;
    stream-bf16-moe-parity50)
      # Twenty-eighth session (issue #16, offload-engine/stream-bf16-moments/moe-parity50/): the 4-layer MoE proxy's
      # loss over 50 deterministic steps, one baseline and one run with bf16 moments at fraction 1 (one round: no speed
      # figure), after the kernel's GPU test. Its folder's name does not start with the phase's: saved by name.
      d="$runs/stream-bf16-moe-parity50"; mkdir -p "$d"
      [ -f "$d/kernel-test.log" ] || $py -m pytest tests/runtime/test_gpu_engine.py -k fused_adam_with_bf16 -v \
        -p no:cacheprovider > "$d/kernel-test.log" 2>&1
      tail -n 3 "$d/kernel-test.log"
      $py scripts/bench_offload.py --recipe qwen3_30b_a3b_proxy_pretrain_config --out "$d" --deterministic --resume \
        --host-json "$(host_json)" --fractions 1 --configs engine-stream-bf16-moments --repeats 1 --baseline-runs 1 \
        model.num_layers=4 train.train_iters=50 ;;
    ring-pipeline)
      # Twenty-fifth session (issue #16, offload-engine/ring-pipeline/, one H100, 64 s in the call that shipped the
      # bundle's first part; torch only, it needs no install). The
      # stream mode's ring in plain torch (offload-engine/ring-pipeline/ring_bench.py): the 4-layer MoE proxy's 3.1B
      # offloaded parameters' moments (24.8 GB each way) through 32 chunks and a ring of 3 slots (the engine's) or 8,
      # with and without a stand-in forward of 4 layers that waits per layer for its 8 chunks. It says whether the ring
      # moves the moments at the link's rate both ways at once, and how much of the copies a 0.4 s forward hides,
      # without the MoE model: the stream step there costs ~0.6 s more than its baseline (1.45x), the copies >= 0.5 s.
      d="$runs/ring-pipeline"; mkdir -p "$d"
      $py docs/benchmarks/offload-engine/ring-pipeline/ring_bench.py --params 3.1e9 --layers 4 --layer-ms 100 \
        --slots 3,8 --repeats 2 --out "$d/results.json" 2>&1 | tee "$d/ring_bench.log" ;;
    ring-half-bytes)
      # Twenty-seventh session (issue #16, offload-engine/ring-pipeline/half-bytes/, one H100, 27 s + 35 s, torch only,
      # from the tree of commit b4d2f19): the same ring and stand-in forward with half the bytes each way (12.4 GB:
      # the 4-layer MoE proxy's moments in bf16, 4 B a parameter instead of 8) against the full 24.8 GB in the same
      # call. It says how much of the stream step's cost fewer bytes on the ring would remove (design section 9.3).
      d="$runs/ring-half-bytes"; mkdir -p "$d"
      for bytes in half:1.55e9 full:3.1e9; do
        $py docs/benchmarks/offload-engine/ring-pipeline/ring_bench.py --params "${bytes#*:}" --layers 4 --layer-ms 100 \
          --slots 3 --repeats 2 --out "$d/results-${bytes%%:*}-bytes.json" 2>&1 | tee "$d/ring_bench-${bytes%%:*}-bytes.log"
      done ;;
    stream-moe-profile)
      # Twenty-fifth session (issue #16, offload-engine/stream-moe-profile/, one H100, 250 s): where the MoE proxy's
      # stream step loses ~0.6 s (bench-stream-moe-deterministic/:
      # 1.45x at fraction 1; its plan puts the moments' copies at >= 0.5 s a step, which the forward should partly
      # hide). PyTorch's profiler on steps 10-12 of the 4-layer proxy (as stream-profile), deterministic (the same routing in both runs),
      # without offload and with stream at fraction 1, one after the other; mbridge_offload.bench.gpu_trace reads each
      # trace (each stream's busy time, the copies' rates while copying, the training stream's idle gaps and what
      # surrounds them). The traces themselves are not kept (tens of MB).
      d="$runs/stream-moe-profile"; mkdir -p "$d"
      for name in baseline stream-1; do
        if [ $name = baseline ]; then extra="optimizer.optimizer_cpu_offload=False optimizer.optimizer_offload_fraction=0"
        else extra="--offload-engine stream optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=1"; fi
        $py scripts/run_recipe.py --recipe qwen3_30b_a3b_proxy_pretrain_config --deterministic --out "$d/$name" \
          model.num_layers=4 train.train_iters=13 profiling.use_pytorch_profiler=True profiling.profile_step_start=10 \
          profiling.profile_step_end=12 $extra > "$d/$name.log" 2>&1; echo "$name: exit $?"
        $py -m mbridge_offload.bench.gpu_trace "$d/$name/torch_profile/rank-0.json.gz" --out "$d/$name-gpu_trace.md"
        rm -rf "$d/$name/torch_profile"
      done ;;
    stream-moe-parity-50)
      # Eighteenth session (issue #16, docs/benchmarks/offload-engine/stream-moe-parity-50/, from the tree of commit
      # dda1b64, right after stream-moe-bench with DETERMINISTIC=1; 157 s + 206 s): the 4-layer MoE proxy's loss
      # parity over 50 deterministic steps, one baseline and one stream run at fraction 1 (one round: no speed
      # figure). Without --host-json the bench measures the host first. Compared on the CPU machine with
      # python -m mbridge_offload.bench.engine_parity (the folder's engine_parity.md). Its folder's name does not
      # start with the phase's, so it is saved by name here (an interrupted call saves nothing of it).
      $py scripts/bench_offload.py --recipe qwen3_30b_a3b_proxy_pretrain_config \
        --out "$runs/stream-moe-parity50-deterministic" --deterministic --resume --fractions 1 --configs engine-stream \
        --repeats 1 --baseline-runs 1 model.num_layers=4 train.train_iters=50
      save_phase stream-moe-parity50 ;;
    alloc-conf)
      # Twelfth session (issue #15, docs/benchmarks/alloc-conf/): is the recipes' PYTORCH_CUDA_ALLOC_CONF=
      # expandable_segments:True (Megatron Bridge's COMMON_RECIPE_ENV_VARS, applied to the environment inside
      # pretrain) in effect, and what does the allocator reserve with it set in the shell before the process
      # starts? Held-out cases of planner-heldout-2 again, side by side: the MoE one under both settings, the dense
      # one with the shell's (its recipe-env run is in planner-heldout-2/). Each run records
      # allocator_expandable_segments at step 1. Beside them: does importing the stack start CUDA?
      $py -c "import torch, megatron.bridge.training.pretrain, transformer_engine.pytorch; \
print('CUDA initialized by the imports:', torch.cuda.is_initialized())" > "$runs/alloc-conf-imports.log" 2>&1 &
      DEST=alloc-conf/recipe-env RUNS=$runs bash docs/benchmarks/planner-heldout-2/run.sh moe-proxy-2-fine-grained-sl8192 &
      PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True DEST=alloc-conf/shell-env RUNS=$runs \
        bash docs/benchmarks/planner-heldout-2/run.sh moe-proxy-2-fine-grained-sl8192+1b-proxy-unfused-loss-sl4096 &
      wait
      mkdir -p "$runs/alloc-conf" && mv "$runs/alloc-conf-imports.log" "$runs/alloc-conf/imports.log"
      cat "$runs/alloc-conf/imports.log"
      grep -h '"step": 1,' "$runs"/alloc-conf/*/*/metrics.rank0.jsonl | cut -c1-600 ;;
    stream-profile)
      # Twelfth session (issue #16, docs/benchmarks/offload-engine/stream-profile/): where the stream mode's 25%
      # cost goes on the GPU: a torch.profiler trace of steps 10-12 of the dense proxy at fraction 0.25, read by
      # mbridge_offload.bench.gpu_trace (each stream's busy time, the copies' rates, the training stream's gaps).
      d="$runs/stream-profile"; mkdir -p "$d"
      $py scripts/run_recipe.py --recipe qwen3_1b_proxy_pretrain_config --offload-engine stream --out "$d/stream-0.25" \
        train.train_iters=13 optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=0.25 \
        profiling.use_pytorch_profiler=True profiling.profile_step_start=10 profiling.profile_step_end=12 \
        > "$d/stream-0.25.log" 2>&1; echo "exit $?"
      $py -m mbridge_offload.bench.gpu_trace "$d/stream-0.25/torch_profile/rank-0.json.gz" --out "$d/gpu_trace.md" ;;
    resume-delayed)
      # Thirty-sixth session (issue #16, offload-engine/resume-delayed/; ran there, one H100, 218 s in the install's
      # call: each of the three resumed bit for bit): save at step 3 and resume to 6 (2-layer proxy, deterministic) with the delayed engine, never resumed
      # on a GPU, and with the exact and delayed engines zeroing by region, resumed only on the CPU stand-in
      # (test_exact_ranks.py, test_delayed_ranks.py, test_zero_by_region.py). check_resume now runs the first part
      # first and, with the delayed engine, has the uninterrupted run save its weights at the same iteration (a save
      # applies the pending update, so the step after it runs undelayed). Side by side: parity, not speed.
      d="$runs/resume-delayed"; mkdir -p "$d"
      resume="scripts/check_resume.py --recipe qwen3_1b_proxy_pretrain_config --fractions 1 --save-at 3 --deterministic"
      $py $resume --out "$d/delayed" model.num_layers=2 +env_vars.MBRIDGE_OFFLOAD_ENGINE=delayed > "$d/delayed.log" 2>&1 &
      $py $resume --out "$d/delayed-by-region" model.num_layers=2 +env_vars.MBRIDGE_OFFLOAD_ENGINE=delayed \
        +env_vars.MBRIDGE_OFFLOAD_ZERO_BY_REGION=on > "$d/delayed-by-region.log" 2>&1 &
      $py $resume --out "$d/exact-by-region" model.num_layers=2 +env_vars.MBRIDGE_OFFLOAD_ENGINE=exact \
        +env_vars.MBRIDGE_OFFLOAD_ZERO_BY_REGION=on > "$d/exact-by-region.log" 2>&1 &
      wait
      tail -n 5 "$d"/*/resume_parity.md ;;
    delayed-ablation)
      # Thirty-seventh session (issue #16, offload-engine/delayed-ablation/; ran there, one H100, 2 rounds: the copies
      # hold the step at 1.29x, the CPU Adam alone 1.10-1.11x): what holds the delayed mode above 1.10x
      # is still open after the pieces, one piece in flight, the zeroing by region and fewer Adam threads. The mode at
      # fraction 1 whole, without its CPU Adam, without its copies either way, and without both (its hooks, threads
      # and events only; patch/sitecustomize.py, MBRIDGE_BENCH_ABLATE: timing only, the weights train wrong), beside
      # the baseline, in interleaved rounds of 33 steps (~1 min a run; resumed where a cut call left it).
      $py docs/benchmarks/offload-engine/delayed-ablation/ablation.py --out "$runs/delayed-ablation" --resume \
        --rounds ${ROUNDS:-2} train.train_iters=33 ;;
    delayed-ablation-directions)
      # Thirty-seventh session (issue #16, offload-engine/delayed-ablation/; ~9 min): delayed-ablation found the copies
      # holding the delayed step (1.29x; the copies alone 1.26-1.29x, the CPU Adam alone 1.10-1.11x). Which direction:
      # the gradients' D2H alone and the weights' H2D alone (the CPU Adam skipped in both), beside the baseline, the
      # copies both ways and neither, 2 rounds interleaved, 33 steps (timing only, the weights train wrong).
      $py docs/benchmarks/offload-engine/delayed-ablation/ablation.py --out "$runs/delayed-ablation-directions" \
        --resume --rounds ${ROUNDS:-2} --runs baseline,no-adam,d2h-only,h2d-only,neither train.train_iters=33 ;;
    delayed-ablation-profiles)
      # Thirty-eighth session (issue #16, offload-engine/delayed-ablation/; ~6 min): where each direction's copies
      # cost the step, seen on the GPU: the baseline, the gradients' D2H alone, the weights' H2D alone and neither
      # (the CPU Adam skipped in the last three; timing only), each once for 13 steps under PyTorch's profiler, read
      # by gpu_trace (the training stream's gaps and what ran beside them).
      $py docs/benchmarks/offload-engine/delayed-ablation/ablation.py --out "$runs/delayed-ablation-profiles" \
        --resume --profile --runs baseline,d2h-only,h2d-only,neither ;;
    delayed-d2h-read)
      # Thirty-eighth session (issue #16, offload-engine/delayed-ablation/; ~1.5 min; ran in the forty-first, d2h-read/:
      # Bridge's logical_and_across_model_parallel_group): which scalar read waits ~75 ms a
      # step behind the delayed mode's gradient copy (profiles/d2h-only-gpu_trace.md names only _local_scalar_dense):
      # the D2H alone profiled with Python stacks, gpu_trace naming the Python function that launched each gap's read.
      $py docs/benchmarks/offload-engine/delayed-ablation/ablation.py --out "$runs/delayed-d2h-read" --resume \
        --profile --stacks --runs d2h-only ;;
    d2h-spacing)
      # Thirty-eighth session (issue #16, offload-engine/d2h-by-kernel/; ~1 min, plain torch + Triton: runs before the
      # bundle's install): the delayed mode's D2H alone costs 1.15x, its training stream's scalar read waiting ~75 ms
      # a step behind it with two pieces in flight (delayed-ablation/profiles/). In d2h_by_kernel.py two in flight
      # held a read for the whole copy, one in flight did not. Pieces all enqueued at once with a GPU-side pause
      # between them (no thread to wake), against one and two in flight, with the step's thread idle in its reads
      # and with it holding the interpreter's lock in launches.
      d="$runs/d2h-spacing"; mkdir -p "$d"
      for busy in 0 50; do
        $py docs/benchmarks/offload-engine/d2h-by-kernel/d2h_by_kernel.py --busy-launches $busy \
          --modes none,ce-pieces-2,ce-pieces-1,ce-spaced-20,ce-spaced-200,none --out "$d/busy-$busy.json" \
          > "$d/busy-$busy.log" 2>&1; tail -n 7 "$d/busy-$busy.log"
      done ;;
    delayed-read-fixes)
      # Thirty-ninth session (issue #16, offload-engine/delayed-read-fixes/; ran in the fortieth with ROUNDS=2 and the
      # first profile, on an H100 whose baseline was too slow and noisy to size the step time; in the forty-first with
      # CONFIGS=engine-delayed,engine-delayed-copies-next-step-spaced, 3 rounds, and the spaced profile (then without
      # Python stacks), on a quiet H100: both together 1.25x, as-run 1.28-1.30x; in the forty-second with
      # CONFIGS=engine-delayed,engine-delayed-copies-next-step,engine-delayed-spaced and MAX_BASELINE_CV=10 on a noisy
      # H100 (not sized: one order in every round on a host that sped up) and the spaced profile with stacks
      # (the logged step's device-wide synchronize); owed: all four on a quiet host (copy next-step-gpu_trace.md and
      # spaced-stacks-gpu_trace.md, as spaced-gpu_trace.md, into $RUNS/delayed-read-fixes/ first to skip the profiles);
      # ~20 min for 4 rounds of all four (4: each configuration then takes each place in its round once), ~1.5 min a
      # profile; split over calls with --resume, ROUNDS=1 for one round): the delayed
      # mode's D2H alone cost 1.15x, a scalar read of the step waiting ~75 ms behind it (delayed-ablation/profiles/).
      # Two ways to let the reads through,
      # against the delayed mode as it ran and the baseline, interleaved, 33 steps: the copies handed over at the next
      # step's gradient zeroing, after the step's reads (MBRIDGE_OFFLOAD_DELAYED_COPY_START=next-step, design section
      # 16), and every piece enqueued at once, each after a ~20 us GPU-side pause (MBRIDGE_OFFLOAD_COPY_PIECE_
      # PAUSE_US=20: d2h-spacing let the reads through that way at the copy's full rate), and both together (without
      # spaced pieces the first forward's end waits for the copy thread to enqueue the last piece: design section 16).
      # Then a profile of each of the two.
      # CONFIGS sets the configurations and their order in the first round (the baseline first; each later round
      # starts one further on). The bench stops after its
      # first baseline (exit 3; the profiles still run) where that baseline's steps vary more than MAX_BASELINE_CV
      # percent (default 5): the fortieth session's host varied 6-10 %, the quiet H100s 2-4 %. Then spend the call on
      # work that does not need a quiet host; a later --resume checks the first baseline it runs anew.
      d="$runs/delayed-read-fixes"; mkdir -p "$d"
      $py scripts/bench_offload.py --recipe qwen3_1b_proxy_pretrain_config --out "$d/bench" --resume \
        --host-json "$(host_json)" --fractions 1 --max-baseline-cv ${MAX_BASELINE_CV:-5} \
        --configs ${CONFIGS:-engine-delayed,engine-delayed-copies-next-step,engine-delayed-spaced,engine-delayed-copies-next-step-spaced} \
        --repeats ${ROUNDS:-4} --baseline-runs ${ROUNDS:-4} train.train_iters=33
      offload="--offload-engine delayed optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=1"
      [ -f "$d/next-step-gpu_trace.md" ] || profiled_run next-step $offload \
        ++env_vars.MBRIDGE_OFFLOAD_DELAYED_COPY_START=next-step
      [ -f "$d/spaced-gpu_trace.md" ] || profiled_run spaced $offload ++env_vars.MBRIDGE_OFFLOAD_COPY_PIECE_PAUSE_US=20 \
        profiling.pytorch_profiler_collect_callstack=True ;;
    delayed-bf16-grads)
      # Forty-third session, not yet run (issue #16, offload-engine/delayed-read-fixes/bf16-grads/; ~3 min, any host:
      # it sizes memory, not time): copies from the next step hold the gradients the D2H reads until the copies end
      # under the next forward. With fp32 gradient buffers (the recipes' bf16_mixed) those are the DDP buffers, never freed, so
      # no peak rose in delayed-read-fixes; with bf16 gradient buffers they are fp32 temporaries of the offloaded
      # main gradients (~4 bytes per offloaded parameter), held longer. The dense proxy at fraction 1 with bf16
      # gradient buffers (mixed_precision=null: the preset would write grad_reduce_in_fp32 back), one round of 13
      # steps: the baseline, the delayed mode as it runs and copies from the next step (spaced pieces change when the
      # pieces are enqueued, not what they read). The peaks are in each run's summary.json; one round's step times
      # say nothing.
      d="$runs/delayed-bf16-grads"; mkdir -p "$d"
      $py scripts/bench_offload.py --recipe qwen3_1b_proxy_pretrain_config --out "$d/bench" --resume \
        --host-json "$(host_json)" --fractions 1 --max-baseline-cv 100 \
        --configs engine-delayed,engine-delayed-copies-next-step \
        --repeats 1 --baseline-runs 1 --short-runs train.train_iters=13 \
        mixed_precision=null ddp.grad_reduce_in_fp32=False
      for f in "$d"/bench/*/summary.json; do
        echo "$(basename "$(dirname "$f")"): $(grep -h '"peak_allocated_gib\|"peak_reserved_gib\|"peak_device_used\|"final_loss' \
          "$f" | tr -d ' \n')"
      done ;;
    copy-window-spaced)
      # Thirty-ninth session (issue #16, offload-engine/copy-window/, its third run in the fortieth; ~1 min, plain torch
      # and the plugin's copy loop:
      # runs before the bundle's install): the engine's own spaced pieces (copy_in_pieces with copy_pieces.gpu_pause,
      # what MBRIDGE_OFFLOAD_COPY_PIECE_PAUSE_US runs) beside one and two in flight: does another stream's small copy
      # get in between pieces in both directions, and at what cost to the large copy.
      d="$runs/copy-window-spaced"; mkdir -p "$d"
      $py docs/benchmarks/offload-engine/copy-window/copy_window.py \
        --scenarios alone,at-once,window-2,window-1,spaced-20,spaced-200 --out "$d/copy_window.json" \
        > "$d/copy_window.log" 2>&1; cat "$d/copy_window.log" ;;
    delayed-threads)
      # Thirty-fifth session (issue #16, offload-engine/delayed-threads/; ran in the thirty-sixth, one H100, two calls:
      # the three profiles and the bench's first round before the device time ran out; CPU Adam on 11 threads made
      # the step slower, not faster): zero-by-region/'s profile of the delayed mode with one piece of the
      # copies in flight had none of the gaps where the training loop's scalar reads waited behind the gradients'
      # D2H, yet its step was not faster. CPU Adam runs there on 15 threads (streaming_engine keeps one of the 16 for
      # the launches) beside the training thread and two copy threads: more threads than cores. Profiles of the
      # delayed mode with two pieces in flight, with one, and with one and --cpu-threads at three quarters of the
      # cores (CPU Adam on 11 threads), all without the zeroing by region (no gain, zero-by-region/); then the same
      # three against their own baselines, 3 rounds interleaved, 33 steps. (This also stands for copy-pieces' owed
      # second profile, with the column of when the work after each gap was launched.)
      d="$runs/delayed-threads"; mkdir -p "$d"
      offload="--offload-engine delayed optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=1"
      [ -f "$d/two-pieces-gpu_trace.md" ] || profiled_run two-pieces $offload
      [ -f "$d/one-piece-gpu_trace.md" ] || profiled_run one-piece $offload ++env_vars.MBRIDGE_OFFLOAD_COPY_PIECES_IN_FLIGHT=1
      [ -f "$d/one-piece-fewer-threads-gpu_trace.md" ] || profiled_run one-piece-fewer-threads $offload \
        --cpu-threads $(( $(nproc) * 3 / 4 )) ++env_vars.MBRIDGE_OFFLOAD_COPY_PIECES_IN_FLIGHT=1
      $py scripts/bench_offload.py --recipe qwen3_1b_proxy_pretrain_config --out "$d/bench" --resume \
        --host-json "$(host_json)" --fractions 1 \
        --configs engine-delayed,engine-delayed-one-piece,engine-delayed-one-piece-three-quarter-cores --repeats 3 \
        --baseline-runs 3 train.train_iters=33 ;;
    zero-by-region)
      # Thirty-fourth session (issue #16, offload-engine/zero-by-region/; run in the thirty-fifth, one H100, 2 calls:
      # with the install, then 287 s resumed: both engines' updates unchanged in the GPU test, delayed 1.40x with it
      # against 1.34x without, no gain): the gradient buffers zeroed by region
      # (MBRIDGE_OFFLOAD_ZERO_BY_REGION=on, runtime/grad_regions.py, design section 12), built and run on the CPU
      # stand-in only. First the engine's GPU test (exact by region bit-identical to the library's offloaded path,
      # delayed by region to delayed, 8 steps: a wait missing on a GPU stream would part the losses), then the
      # delayed mode's profile by region (copy-pieces/'s delayed-1 showed the training stream idle behind the D2H
      # before the first backward), then the delayed mode with and without it against their own baselines, 3 rounds
      # interleaved, 33 steps.
      d="$runs/zero-by-region"; mkdir -p "$d"
      [ -f "$d/gpu-tests.log" ] || $py -m pytest tests/runtime/test_gpu_engine.py -k zeroing_by_region -v \
        -p no:cacheprovider > "$d/gpu-tests.log" 2>&1
      tail -n 4 "$d/gpu-tests.log"
      [ -f "$d/delayed-by-region-gpu_trace.md" ] || profiled_run delayed-by-region --offload-engine delayed \
        optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=1 \
        ++env_vars.MBRIDGE_OFFLOAD_ZERO_BY_REGION=on
      $py scripts/bench_offload.py --recipe qwen3_1b_proxy_pretrain_config --out "$d/bench" --resume \
        --host-json "$(host_json)" --fractions 1 --configs engine-delayed,engine-delayed-by-region --repeats 3 \
        --baseline-runs 3 train.train_iters=33 ;;
    copy-window-bench)
      # Thirty-third session (issue #16, offload-engine/copy-window-bench/; run in the thirty-fourth, one noisy H100,
      # baselines 14.1 % apart, 2 calls: with the install, then 318 s resumed: two in flight 1.16x, one 1.28x): the
      # delayed mode at fraction 1 with two pieces of its copies in flight (the default) and with one
      # (MBRIDGE_OFFLOAD_COPY_PIECES_IN_FLIGHT=1), against their own baselines, 3 rounds interleaved, 33 steps.
      d="$runs/copy-window-bench"; mkdir -p "$d"
      $py scripts/bench_offload.py --recipe qwen3_1b_proxy_pretrain_config --out "$d/bench" --resume \
        --host-json "$(host_json)" --fractions 1 --configs engine-delayed,engine-delayed-one-piece --repeats 3 \
        --baseline-runs 3 train.train_iters=33 ;;
    copy-window)
      # Thirty-fourth session (issue #16, offload-engine/copy-window/; plain torch and the plugin's copy loop, no bundle
      # needed; the version below ran in the thirty-fifth session, 10 s on one H100: with two pieces in flight the small
      # copy waited for the whole 4.47 GB copy, ~80 ms, with one 0.9 ms): copy-pieces/'s profile showed the training stream's own small copies waiting 8-32
      # ms behind the engine's copies in 128 MiB pieces with two in flight. Does a small copy of another stream wait
      # for one piece, or until the copy thread's queue runs dry? Both directions; at once, one piece in flight, two;
      # a thread launches small kernels as the training thread does. The small copy is timed behind a 3 ms sleep
      # kernel, so the events time the GPU's wait and not the launching thread's. The thirty-fourth session ran the
      # first version (commit e5c52b3: no gate, a pure-Python thread holding the lock; 388 s on one H100): it measured
      # the interpreter's lock, not the copy queue (README there).
      d="$runs/copy-window"; mkdir -p "$d"
      $py docs/benchmarks/offload-engine/copy-window/copy_window.py --gb 4.47 --tensors 300 --piece-mb 128 \
        --every-ms 5 --gate-ms 3 --out "$d/results.json" 2>&1 | tee "$d/copy_window.log" ;;
    copy-pieces)
      # Thirty-third session (issue #16, offload-engine/copy-pieces/, one H100, from the working tree of 63a0812 with the
      # weight copies uncommitted and two pieces in flight; two calls: with the install, then 281 s resumed; exact
      # bit-identical, delayed 1.29x, exact 1.50x; the profile still showed the training stream's copies waiting 8-32
      # ms behind the engine's: copy-window is to tell whether one piece in flight does better). The exact and delayed
      # engines with both copies in
      # pieces from threads of their own, the gradients to the host (gradient_copies.py, built and measured in the
      # thirty-second session, d2h-pieces/, then changed by a review) and now the updated weights back
      # (weight_copies.py: the library's hook enqueued a chunk's ~0.5-1.24 GB at once, and delayed-profile/ saw the
      # training stream idle 12.2 ms of a 12.4 ms gap while only that H2D ran). First the profile of
      # delayed-profile/ for no offload and delayed at fraction 1: are its ~75 ms a step of training stream idle behind
      # the D2H gone? Then the engine's GPU test (exact bit-identical to the library's offloaded path over 8 steps),
      # then fraction 1 against its own baselines, 3 rounds interleaved, 33 steps each (d2h-pieces' bench).
      d="$runs/copy-pieces"; mkdir -p "$d"
      offload="--offload-engine delayed optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=1"
      [ -f "$d/baseline-gpu_trace.md" ] || profiled_run baseline optimizer.optimizer_cpu_offload=False \
        optimizer.optimizer_offload_fraction=0
      [ -f "$d/delayed-1-gpu_trace.md" ] || profiled_run delayed-1 $offload
      engine_gpu_test_and_bench ;;
    d2h-queue)
      # Thirty-second session (issue #16, offload-engine/d2h-queue/, one H100, 28 s, from the working tree of fcb56f2
      # with this loop over the connections added; plain torch, no bundle needed): does a step-end read on the training stream wait
      # behind the gradients' 4.47 GB D2H on the copy stream (offload-engine/delayed-profile/'s reading of its ~75 ms
      # gaps), and does issuing the D2H in pieces bound the wait? offload-engine/d2h-queue/d2h_queue.py. It does: 81.8 ms
      # at once, 5.2 ms in 256 MiB pieces, with either number of hardware queues.
      d="$runs/d2h-queue"; mkdir -p "$d"
      # Twice: with CUDA's default of 8 hardware queues, and with 1 (as Megatron sets for TP comm overlap).
      for connections in default 1; do
        ( if [ $connections = 1 ]; then export CUDA_DEVICE_MAX_CONNECTIONS=1; else unset CUDA_DEVICE_MAX_CONNECTIONS; fi
          $py docs/benchmarks/offload-engine/d2h-queue/d2h_queue.py --gb 4.47 --tensors 300 --compute-ms 150 \
            --piece-mb 256 --repeats 5 --out "$d/results-connections-$connections.json" 2>&1 \
            | tee "$d/d2h_queue-connections-$connections.log" )
      done ;;
    d2h-pieces)
      # Thirty-second session (issue #16, offload-engine/d2h-pieces/, one H100, from the working tree of fcb56f2 with
      # gradient_copies.py's first version uncommitted; two calls: with the install, then 457 s resumed; delayed 1.16x, exact 1.40x).
      # The exact and delayed modes with the gradients' copy to the host issued in
      # pieces from a thread of its own (mbridge_offload/runtime/gradient_copies.py, after d2h-queue/ showed a
      # step-end read waiting 81.8 ms behind the copy issued at once and 5.2 ms behind 256 MiB pieces). First the
      # engine's GPU test (exact bit-identical to the library's offloaded path over 8 steps, delayed trains), then
      # fraction 1 against its own baselines, 3 rounds interleaved, 33 steps each (delayed-bench's command with exact
      # added): delayed was 1.37x there (goal 1.10x), with the gradients' 4.47 GB D2H run serially at each step's end.
      d="$runs/d2h-pieces"; mkdir -p "$d"
      engine_gpu_test_and_bench ;;
    delayed-profile)
      # Thirty-first session (issue #16, offload-engine/delayed-profile/, one H100, from the tree of commit aa10e26,
      # 206 s): where the delayed mode's 0.137 s a step goes (offload-engine/bench-delayed/:
      # 1.37x at fraction 1, and the training thread never waited at the drain). The dense proxy, 13 steps each, one
      # after the other: no offload, delayed at fraction 1 with the default threads (the worker's Adam on cores - 1),
      # and delayed with --cpu-threads 8 (the worker's Adam on 7 threads). PyTorch's profiler asked for steps 10-12
      # (Megatron Bridge's schedule: step 9 warms up, 10-11 are traced), read by
      # mbridge_offload.bench.gpu_trace: a gap in the training stream is the GPU's compute waiting, on an event (the
      # H2D of the updated weights, the gradients' zeroing) or on the CPU launching work. If the worker's threads
      # starve the training thread's launches, the run with 8 threads has fewer gaps and a shorter step. Steps 4-8,
      # before the profiler's warm-up, give each run's step time (metrics.rank0.jsonl). The traces are not kept.
      d="$runs/delayed-profile"; mkdir -p "$d"
      offload="--offload-engine delayed optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=1"
      profiled_run baseline optimizer.optimizer_cpu_offload=False optimizer.optimizer_offload_fraction=0
      profiled_run delayed-1 $offload
      profiled_run delayed-1-threads-8 --cpu-threads 8 $offload ;;
    alloc-expandable)
      # Twelfth session (issue #15, docs/benchmarks/alloc-conf/): the allocator's reserve once the recipes'
      # expandable segments are in effect, on calibration and held-out cases (docs/benchmarks/alloc-conf/run.sh).
      # The twelfth session ran its first wave (WAVES=4b-sl2048+1p7b-sl2048-mb2-mlp-overlap+1b-proxy-fraction-1,
      # 90 s), the thirteenth the other two (262 s, at commit d4998d7); the planner's expandable reserve is set on
      # the calibration cases.
      RUNS=$runs bash docs/benchmarks/alloc-conf/run.sh ${WAVES:-4b-sl2048+1p7b-sl2048-mb2-mlp-overlap+1b-proxy-fraction-1 \
        moe-proxy-6-sl4096-mb2-overlap+1p7b-sl8192-block4 moe-proxy-4-fraction-0.5+1b-proxy-fraction-0+0p6b-activation-offload-sl4096-mb2}
      grep -h '"step": 1,' "$runs"/alloc-conf/{calibration,heldout}/*/metrics.rank0.jsonl | grep -o '"allocator_[a-z_]*": [a-zA-Z0-9]*' | sort | uniq -c
      [ -n "${OUT:-}" ] && tar czf "$OUT/alloc-expandable-runs.tgz" -C "$runs" --exclude=tb alloc-conf/calibration alloc-conf/heldout ;;
    stream-lazy-parity)
      # Twelfth session (issue #16, docs/benchmarks/offload-engine/stream-lazy/): the stream mode enqueueing its
      # update from the next forward's module pre-hooks instead of inside the optimizer step: 50 deterministic
      # steps at fractions 1 and 0.25 against no offload, a save at 3 resumed to 6, and the stream GPU test.
      # Ran again in the thirteenth session after the review's changes (commit d4998d7, 222 s):
      # offload-engine/stream-lazy/after-review/.
      stream_parity "$runs/stream-lazy-parity" -k stream ;;
    stream-lazy-moe)
      # Twelfth session (issue #16, docs/benchmarks/offload-engine/stream-lazy/): the same change on the MoE proxy
      # (2 layers; one optimizer on one GPU: the zeroing's wait for a dense and an expert one is written, not run):
      # deterministic, 8 steps,
      # no offload and stream at fraction 1 side by side, compared step by step.
      d="$runs/stream-lazy-moe"; mkdir -p "$d"
      for run in baseline stream-1; do
        case $run in baseline) offload="optimizer.optimizer_cpu_offload=False optimizer.optimizer_offload_fraction=0" ;;
          *) offload="--offload-engine stream optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=1" ;; esac
        $py scripts/run_recipe.py --recipe qwen3_30b_a3b_proxy_pretrain_config --deterministic --cpu-threads 6 \
          --out "$d/$run" model.num_layers=2 train.train_iters=8 $offload > "$d/$run.log" 2>&1 &
      done
      wait
      $py -m mbridge_offload.bench.engine_parity --out "$d" "stream (1) vs no offload, MoE proxy=$d/baseline:$d/stream-1" ;;
    stream-lazy-bench)
      # Twelfth session (issue #16, docs/benchmarks/offload-engine/bench-stream-lazy/): the 25% speed after that
      # change, 3 rounds interleaved with their baselines, 33 steps each (engine_step_s: the training thread's
      # time in the engine, the enqueueing in the forward's hooks included). Ran 5 of its 6 runs (~65 s each, not
      # the ~35 s planned); the call's limit cut the sixth and the runs were lost with the machine. Fifteenth session, at
      # commit 181f30e: FRACTIONS=0.25,1 (526 s), committed as offload-engine/bench-stream-lazy/. Nineteenth session,
      # from the tree of commit 155fb59 (318 s, baselines 0.48 s, 15 % apart): offload-engine/bench-stream-lazy-2/.
      # Twentieth session, from the tree of commit 17e0846 (379 s, baselines 0.559 s, 28.2 % apart):
      # offload-engine/bench-stream-lazy-3/. Thirtieth session, from the tree of commit b81c250 on one H100 (257 s,
      # baselines 0.366 s, 0.9 % apart, 1.04x): offload-engine/bench-stream-lazy-4/.
      $py scripts/bench_offload.py --recipe qwen3_1b_proxy_pretrain_config --out "$runs/stream-lazy-bench" --resume \
        --host-json "$(host_json)" --fractions ${FRACTIONS:-0.25} --configs engine-stream --repeats 3 --baseline-runs 3 \
        train.train_iters=33 ;;
    delayed-bench)
      # Issue #16 (~6-7 min): the opt-in delayed mode (one-step delayed update) at fraction 1 against its
      # own baselines, 3 rounds interleaved, 33 steps each: its goal is <= 1.10x, unmeasured since the eighth session's
      # engine-bench (bench-dense-1/), whose delayed runs ran before the engine's later changes. Ran in the thirtieth
      # session, from the tree of commit b81c250 on one H100 (317 s, 1.37x: not met): offload-engine/bench-delayed/.
      $py scripts/bench_offload.py --recipe qwen3_1b_proxy_pretrain_config --out "$runs/delayed-bench" --resume \
        --host-json "$(host_json)" --fractions 1 --configs engine-delayed --repeats 3 --baseline-runs 3 \
        train.train_iters=33 ;;
    alloc-tight)
      # Fourteenth session (issue #15, docs/benchmarks/alloc-tight/): does a run need the allocator's reserve when the
      # device is only 0.25 GiB above its peak allocated + memory outside PyTorch? Two alloc-conf/ runs, each alone
      # beside the ballast (103 s). Fifteenth session, at commit 181f30e (117 s): CASES="1b-proxy-fraction-1-nccl-debug
      # 1b-proxy-fraction-1-warm-communicators", NCCL's account of the dense case's failed allocation, and the same
      # case with every communicator created before step 1 (run_recipe --warm-communicators). Sixteenth session, at
      # commit b71a6f0 (284 s): CASES="0p6b-sl8192-fraction-1 1b-proxy-fraction-1-cumem-off-roomy
      # 1b-proxy-fraction-1-max-channels-4-roomy 1b-proxy-fraction-1-cumem-off 1b-proxy-fraction-1-cumem-off-warm-communicators"
      # (can a communicator be made cheap: alloc-tight/README.md). Seventeenth session, from the tree of commit a4038a3
      # (62 s): CASES=1b-proxy-fraction-1-max-channels-4, the tight dense case with 4 channels (it trained).
      # Nineteenth session, from the tree of commit 155fb59 (88 s): CASES="0p6b-sl8192-mb2-fraction-0.65
      # 0p6b-sl8192-mb2-fraction-0", whether a hole that forms in step 2 costs a tight device anything below
      # fraction 1 (it does not: both trained), and the fraction the first-step reserve rule picks.
      $py docs/benchmarks/alloc-tight/run.py "$runs" ${CASES:-} ;;
    nccl-communicators)
      # Fifteenth session (issue #15, committed as docs/benchmarks/alloc-tight/large-device/, at commit 181f30e, 108 s;
      # ran as this loop typed into the device call, writing to $runs/alloc-tight-large): the dense proxy at fraction 1
      # on the whole device, with and without --warm-communicators, NCCL's allocations logged. What one communicator
      # costs on the device, and how many a run makes and when.
      d=$runs/nccl-communicators; mkdir -p "$d"
      for w in warm cold; do
        flag=; [ $w = warm ] && flag=--warm-communicators
        NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ALLOC $py scripts/run_recipe.py --recipe qwen3_1b_proxy_pretrain_config \
          --num-gpus 1 $flag --out "$d/$w" optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=1 \
          optimizer.overlap_cpu_optimizer_d2h_h2d=True train.train_iters=4 > "$d/$w.log" 2>&1
        echo "$w exit $?"; grep -h "^communicators:" "$d/$w.log"
      done ;;
    planner-heldout-3)
      # Fifteenth session (issue #15, docs/benchmarks/planner-heldout-3/, at commit 181f30e, 368 s): five configurations
      # never run, the host's blind check (overlap on and off, Qwen3-8B) and the GPU plan with expandable segments.
      RUNS=$runs bash docs/benchmarks/planner-heldout-3/run.sh ${WAVES:-8b-sl2048-overlap-off \
        moe-proxy-7-sl2048-overlap-off+1p7b-activation-offload-sl4096-mb2-overlap-on \
        4b-sl4096-mlp-overlap-on+0p6b-sl8192-fraction-1-overlap-on}
      # and the heap release (malloc_trim after setup, thirteenth session): the case that left 1.02 GiB of freed
      # heap in alloc-conf/heldout/ (RSS 62.51 GiB at step 1), again; its log says what was released
      DEST=planner-heldout-3/heap-release RUNS=$runs bash docs/benchmarks/planner-heldout-2/run.sh moe-proxy-6-sl4096-mb2-overlap ;;
    planner-heldout-4)
      # Sixteenth session (issue #15, docs/benchmarks/planner-heldout-4/, at commit b71a6f0, 341 s): the reserve as
      # the loss's largest tensor, on seven configurations where that term decides, none run before.
      RUNS=$runs bash docs/benchmarks/planner-heldout-4/run.sh ${WAVES:-4b-sl4096-mb2-fraction-1+0p6b-sl4096-unfused-loss-fraction-1 \
        1p7b-sl8192-fraction-1+1b-proxy-sl4096-mb3-fraction-1 \
        moe-proxy-2-sl8192-fraction-1+0p6b-sl16384-fraction-1+0p6b-sl8192-fraction-0.9} ;;
    planner-auto-4)
      # Seventeenth session (issue #15, docs/benchmarks/planner-auto-4/, from the tree of commit a4038a3; a third run
      # 0.10 below where the one 0.05 below trains decides the goal): auto with the sixteenth session's planner (the
      # reserve's loss-tensor term, communicators counted by NCCL's channels) on five configurations never run, with
      # 8192-12288 tokens a micro batch where the term decides; device sizes put auto near 0.7. Ran one CASES at a
      # time over four calls (165-268 s a case); 4b-sl8192's third run was cut by the session's device time.
      mkdir -p "$runs/planner-auto-4"
      for case in ${CASES:-1p7b-sl12288 0p6b-sl8192-mb2 moe-proxy-3-sl8192 1b-proxy-sl6144-mb2 4b-sl8192}; do
        case $case in
          1p7b-sl12288) args="66 qwen3_1p7b_pretrain_config model.seq_length=12288 dataset.seq_length=12288" ;;
          0p6b-sl8192-mb2) args="49.5 qwen3_0p6b_pretrain_config model.seq_length=8192 dataset.seq_length=8192 \
            train.micro_batch_size=2 train.global_batch_size=2" ;;
          moe-proxy-3-sl8192) args="44 qwen3_30b_a3b_proxy_pretrain_config model.num_layers=3 model.seq_length=8192 \
            dataset.seq_length=8192" ;;
          1b-proxy-sl6144-mb2) args="45 qwen3_1b_proxy_pretrain_config model.seq_length=6144 dataset.seq_length=6144 \
            train.micro_batch_size=2 train.global_batch_size=2" ;;
          4b-sl8192) args="100 qwen3_4b_pretrain_config model.tensor_model_parallel_size=1 model.seq_length=8192 \
            dataset.seq_length=8192" ;;
          *) echo "unknown case $case"; exit 2 ;;
        esac
        auto_pair "$runs/planner-auto-4" "$case" "$args"
      done ;;
    planner-auto-5)
      # Nineteenth session (issue #15, docs/benchmarks/planner-auto-5/, from the tree of commit 155fb59, three calls:
      # CASES=0p6b-sl12288 123 s, CASES="1b-proxy-sl8192 1p7b-sl10240" 328 s, CASES="1p7b-sl4096-mb3 4b-sl6144"
      # 386 s): auto with MBRIDGE_OFFLOAD_RESERVE_RULE=first-step
      # (reserve-snapshot/README.md: the loss's block counted beside step 1's memory before the GPU part's Adam
      # moments) on five dense configurations never run, device sizes from that rule's plan so auto picks 0.45-0.5
      # (0.45, 0.5, 0.5, 0.5, 0.5 in CASES' order; steady-peak, the default then, picks 0.75, 0.65, 0.65, 0.7, 0.55).
      # auto trained in 5 of 5 but was at most one step above the smallest that trains on only 1: the bar's safety half
      # held, its step half did not. The rule is the default since (it plans closer, and no run shows it less safe:
      # reserve-snapshot/README.md).
      mkdir -p "$runs/planner-auto-5"
      for case in ${CASES:-0p6b-sl12288 1b-proxy-sl8192 1p7b-sl10240 1p7b-sl4096-mb3 4b-sl6144}; do
        case $case in
          0p6b-sl12288) args="38.3 qwen3_0p6b_pretrain_config model.seq_length=12288 dataset.seq_length=12288" ;;
          1b-proxy-sl8192) args="35.6 qwen3_1b_proxy_pretrain_config model.seq_length=8192 dataset.seq_length=8192" ;;
          1p7b-sl10240) args="59.2 qwen3_1p7b_pretrain_config model.seq_length=10240 dataset.seq_length=10240" ;;
          1p7b-sl4096-mb3) args="65.5 qwen3_1p7b_pretrain_config model.seq_length=4096 dataset.seq_length=4096 \
            train.micro_batch_size=3 train.global_batch_size=3" ;;
          4b-sl6144) args="92.5 qwen3_4b_pretrain_config model.tensor_model_parallel_size=1 model.seq_length=6144 \
            dataset.seq_length=6144" ;;
          *) echo "unknown case $case"; exit 2 ;;
        esac
        (export MBRIDGE_OFFLOAD_RESERVE_RULE=first-step; auto_pair "$runs/planner-auto-5" "$case" "$args")
      done ;;
    planner-auto-6)
      # Twenty-fifth session: its first three cases ran on an H100 (planner-auto-6/; the 1.7B cut after its run at auto).
      # Still owed (issue #15, ~17 min; split by CASES over calls, in this order, the 8B's runs the longest): auto with
      # the full-device reserve rule, the default since the thirtieth session (first-step's block, and beside
      # the steady peak only a 0.55 GiB allowance for the sub-page gaps a full device keeps, with a 0.1 % margin;
      # smallest-trains/) on seven dense configurations no auto check ran. Each device is the rule's plan + margin at
      # its pick + 0.05 GiB, so the run at auto's pick tests the allowance itself (a device halfway to the next
      # fraction would hide up to ~1.4 GiB more gaps). The question is the safety half on the 4B and 8B cases: their
      # tensor sizes differ from the 4B the allowance was read from, and planner-auto-4's 4B at 8192 tokens held
      # 0.90-0.92 GiB (planner-auto-3's 4B at 2048 tokens, micro batch 2: 0.61) reserved beyond its peak on devices
      # with room, how much of it stuck unknown; that case runs first, on planner-auto-4's 100 GiB device (the rule
      # picks 0.55 there, 99.95 GiB planned). The 0.6B at micro batch 3, on a device just above its plan at fraction
      # 0, is the first auto check where first-step's block (5.2 GiB of logits beside step 1's memory), not the
      # allowance, sets the reserve. check_auto's runs: at auto, 0.05 below and, where that trains, 0.10 below.
      mkdir -p "$runs/planner-auto-6"
      for case in ${CASES:-4b-sl8192 0p6b-sl6144-mb3 1b-proxy-sl12288 1p7b-sl8192-mb2 4b-sl4096-mb2 4b-sl10240 8b-sl4096}; do
        case $case in
          4b-sl8192) args="100 qwen3_4b_pretrain_config model.tensor_model_parallel_size=1 model.seq_length=8192 \
            dataset.seq_length=8192" ;;
          0p6b-sl6144-mb3) args="51.76 qwen3_0p6b_pretrain_config model.seq_length=6144 dataset.seq_length=6144 \
            train.micro_batch_size=3 train.global_batch_size=3" ;;
          1b-proxy-sl12288) args="42.59 qwen3_1b_proxy_pretrain_config model.seq_length=12288 dataset.seq_length=12288" ;;
          1p7b-sl8192-mb2) args="76.42 qwen3_1p7b_pretrain_config model.seq_length=8192 dataset.seq_length=8192 \
            train.micro_batch_size=2 train.global_batch_size=2" ;;
          4b-sl4096-mb2) args="101.37 qwen3_4b_pretrain_config model.tensor_model_parallel_size=1 model.seq_length=4096 \
            dataset.seq_length=4096 train.micro_batch_size=2 train.global_batch_size=2" ;;
          4b-sl10240) args="112.98 qwen3_4b_pretrain_config model.tensor_model_parallel_size=1 model.seq_length=10240 \
            dataset.seq_length=10240" ;;
          8b-sl4096) args="132.15 qwen3_8b_pretrain_config model.tensor_model_parallel_size=1 model.seq_length=4096 \
            dataset.seq_length=4096" ;;
          *) echo "unknown case $case"; exit 2 ;;
        esac
        (export MBRIDGE_OFFLOAD_RESERVE_RULE=full-device; auto_pair "$runs/planner-auto-6" "$case" "$args")
      done ;;
    planner-auto-7)
      # Twenty-ninth session (issue #15, docs/benchmarks/planner-auto-7/; ~20 min, split by CASES over calls, in this
      # order): planner-auto-6's question on devices an H100 can stand in for, since its 4B and 8B cases need an H200
      # that has not come. auto with the opt-in full-device rule (first-step's block, and beside the steady peak a 0.55
      # GiB allowance for the sub-page gaps a full device keeps, 0.1 % margin) on four Qwen3-4B configurations no auto
      # check has run, two of them with full recompute (no auto check has run recompute), and planner-auto-6's 1.7B
      # again for its runs below auto. The allowance was read from the 4B at 6144 tokens (smallest-trains/); these
      # change the tensor sizes along the sequence, the micro batch and recompute. Each device is the rule's plan +
      # margin at the fraction named + 0.05 GiB (plan_offload.py --json on the CPU, tree of the commit that adds this
      # phase), so auto picks that fraction and the run there tests the allowance itself. check_auto's runs: at auto,
      # 0.05 below and, where that trains, 0.10 below. Ran in the twenty-ninth session on an H100 (planner-auto-7/: the
      # first four cases; without recompute each pick trained, with full recompute the pick ran out of memory and the
      # rule is no longer applied with recompute, so 4b-sl16384-recompute would now test first-step, not this rule).
      mkdir -p "$runs/planner-auto-7"
      recompute="model.recompute_granularity=full model.recompute_method=uniform model.recompute_num_layers=1"
      for case in ${CASES:-4b-sl4096 4b-sl8192-recompute 1p7b-sl8192-mb2 4b-sl3072-mb2 4b-sl16384-recompute}; do
        case $case in
          4b-sl4096) args="75.55 qwen3_4b_pretrain_config model.tensor_model_parallel_size=1 model.seq_length=4096 \
            dataset.seq_length=4096" ;;  # auto 0.6
          4b-sl8192-recompute) args="61.73 qwen3_4b_pretrain_config model.tensor_model_parallel_size=1 \
            model.seq_length=8192 dataset.seq_length=8192 $recompute" ;;  # auto 0.5
          1p7b-sl8192-mb2) args="76.42 qwen3_1p7b_pretrain_config model.seq_length=8192 dataset.seq_length=8192 \
            train.micro_batch_size=2 train.global_batch_size=2" ;;  # auto 0.5, planner-auto-6's device
          4b-sl3072-mb2) args="77.96 qwen3_4b_pretrain_config model.tensor_model_parallel_size=1 model.seq_length=3072 \
            dataset.seq_length=3072 train.micro_batch_size=2 train.global_batch_size=2" ;;  # auto 0.9
          4b-sl16384-recompute) args="67.86 qwen3_4b_pretrain_config model.tensor_model_parallel_size=1 \
            model.seq_length=16384 dataset.seq_length=16384 $recompute" ;;  # auto 0.5
          *) echo "unknown case $case"; exit 2 ;;
        esac
        (export MBRIDGE_OFFLOAD_RESERVE_RULE=full-device; auto_pair "$runs/planner-auto-7" "$case" "$args")
      done ;;
    planner-auto-8)
      # Thirtieth session (issue #15, docs/benchmarks/planner-auto-8/; ~12 min, split by CASES over calls, in this
      # order): the full-device rule without recompute on tensor sizes no auto check has run, on devices an H100 can
      # stand in for. planner-auto-7's 4B at 8192 tokens with full recompute ran out of memory at the rule's pick; the
      # 4B at 8192 tokens without recompute, which would tell recompute from the longer sequence, needs an H200's
      # 100 GiB. The first case keeps the 4B's widths and sequence and cuts its depth to 24 of 36 layers, so it fits.
      # The second is the 8B's widths (hidden 4096) at 16 of 36 layers; the third the first auto check with
      # activation offload (the 1.7B's recipe, 14 of 28 layers offloaded) under this rule. Each device is the rule's
      # plan + margin at 0.6 + 0.05 GiB (plan_offload.py --json on the CPU, from the tree of the commit that adds this
      # phase), where the reserve beside the steady peak is the 0.55 GiB allowance, not the loss's block, so auto picks
      # 0.6 and the run there tests the allowance. check_auto's runs: at auto, 0.05 below and, where that trains,
      # 0.10 below. Ran in the thirtieth session on an H100 (389 s, planner-auto-8/): each pick trained and 0.05 below
      # ran out of memory on all three; full-device is the default since.
      mkdir -p "$runs/planner-auto-8"
      for case in ${CASES:-4b-24-layers-sl8192 8b-16-layers-sl4096 1p7b-activation-offload-sl8192}; do
        case $case in
          4b-24-layers-sl8192) args="69.91 qwen3_4b_pretrain_config model.tensor_model_parallel_size=1 \
            model.num_layers=24 model.seq_length=8192 dataset.seq_length=8192" ;;
          8b-16-layers-sl4096) args="70.32 qwen3_8b_pretrain_config model.tensor_model_parallel_size=1 \
            model.num_layers=16 model.seq_length=4096 dataset.seq_length=4096" ;;
          1p7b-activation-offload-sl8192) args="41.99 qwen3_1p7b_activation_offload_config model.seq_length=8192 \
            dataset.seq_length=8192" ;;
          *) echo "unknown case $case"; exit 2 ;;
        esac
        (export MBRIDGE_OFFLOAD_RESERVE_RULE=full-device; auto_pair "$runs/planner-auto-8" "$case" "$args")
      done ;;
    planner-auto-moe)
      # Twenty-sixth session (planner-auto-moe/, one H100, three calls: 2 cases, then 2, then 1; 482 s for two cases).
      # Issue #15, ~18 min; split by CASES over calls, in this order; every device fits an H100 too. auto
      # with the first-step reserve rule, the MoE default since the twenty-fifth session (reserve-snapshot/'s order of
      # events: the MoE proxy's step-2 communicators come before step 2's loss grows the segment), on four MoE proxy
      # configurations no auto check ran. Each device is the plan + auto's 2 % margin at fraction 0.5 + 0.05 GiB
      # (plan_offload.py --json on the CPU, tree of 77af885), so auto picks 0.5 and the run there tests the plan.
      # check_auto's runs: at auto, 0.05 below and, where that trains, 0.10 below.
      mkdir -p "$runs/planner-auto-moe"
      for case in ${CASES:-moe-proxy-2-sl12288 moe-proxy-3-sl4096-mb2 moe-proxy-4-sl6144 moe-proxy-6-sl4096}; do
        case $case in
          moe-proxy-2-sl12288) args="40.36 qwen3_30b_a3b_proxy_pretrain_config model.num_layers=2 model.seq_length=12288 \
            dataset.seq_length=12288" ;;
          moe-proxy-3-sl4096-mb2) args="46.23 qwen3_30b_a3b_proxy_pretrain_config model.num_layers=3 model.seq_length=4096 \
            dataset.seq_length=4096 train.micro_batch_size=2 train.global_batch_size=2" ;;
          moe-proxy-4-sl6144) args="53.34 qwen3_30b_a3b_proxy_pretrain_config model.num_layers=4 model.seq_length=6144 \
            dataset.seq_length=6144" ;;
          moe-proxy-6-sl4096) args="68.72 qwen3_30b_a3b_proxy_pretrain_config model.num_layers=6 model.seq_length=4096 \
            dataset.seq_length=4096" ;;
          *) echo "unknown case $case"; exit 2 ;;
        esac
        (export MBRIDGE_OFFLOAD_RESERVE_RULE=first-step; auto_pair "$runs/planner-auto-moe" "$case" "$args")
      done ;;
    planner-auto-moe-2)
      # Thirty-first session (issue #15, planner-auto-moe-2/, one H100, from the tree of commit aa10e26): its first two
      # cases ran (CASES=moe-proxy-3-sl6144-mb2, 139 s; CASES=moe-proxy-5-sl8192, 114 s), auto's pick the smallest
      # fraction that trains on both. Thirty-second session (one H100, from the working tree of fcb56f2 with the
      # engine's gradient copies uncommitted, 225 s): CASES=moe-proxy-7-sl4096, auto's pick again the smallest
      # fraction that trains. The default full-device
      # rule on the MoE proxy, which it has only been replayed on (planner-auto-moe/'s devices, sized for first-step).
      # Three MoE proxy configurations no auto check ran, each device the rule's plan + margin at 0.5 + 0.05 GiB
      # (plan_offload.py --json on the CPU, from the tree of the commit that adds this phase), where the 0.55 GiB
      # allowance, not the loss's block, sets the reserve, so the run at auto's pick tests the allowance on MoE
      # tensor sizes. check_auto's runs: at auto, 0.05 below and, where that trains, 0.10 below.
      mkdir -p "$runs/planner-auto-moe-2"
      for case in ${CASES:-moe-proxy-5-sl8192 moe-proxy-3-sl6144-mb2 moe-proxy-7-sl4096}; do
        case $case in
          moe-proxy-5-sl8192) args="63.38 qwen3_30b_a3b_proxy_pretrain_config model.num_layers=5 model.seq_length=8192 \
            dataset.seq_length=8192" ;;
          moe-proxy-3-sl6144-mb2) args="48.86 qwen3_30b_a3b_proxy_pretrain_config model.num_layers=3 \
            model.seq_length=6144 dataset.seq_length=6144 train.micro_batch_size=2 train.global_batch_size=2" ;;
          moe-proxy-7-sl4096) args="75.53 qwen3_30b_a3b_proxy_pretrain_config model.num_layers=7 model.seq_length=4096 \
            dataset.seq_length=4096" ;;
          *) echo "unknown case $case"; exit 2 ;;
        esac
        (unset MBRIDGE_OFFLOAD_RESERVE_RULE; auto_pair "$runs/planner-auto-moe-2" "$case" "$args")
      done ;;
    reserve-snapshot)
      # Eighteenth session (issue #15, docs/benchmarks/reserve-snapshot/, from the tree of commit dda1b64, 80 s): what
      # keeps the loss's logits-sized block reserved beside the peak on some runs
      # and not on others (planner-auto-4/README.md). Two runs of planner-auto-4 again, one after the other on the
      # whole device, at auto's fraction, with the allocator's history of steps 1-2 (run_recipe --memory-snapshot):
      # the 0.6B, which kept 3.11 GiB of its 4.64 GiB of logits (44.41 GiB peak reserved), and the 1.1B proxy, which
      # kept 0.70 of 3.48 (38.79 GiB): compare each run's peak_reserved_gib with those before reading its history.
      # NCCL's INIT lines place each communicator's creation among the iteration lines: the block matters only if it
      # forms before the last of them (alloc-tight/README.md). snapshot_run says what comes back. Read a history with
      # python -m torch.cuda._memory_viz trace_plot FILE -o FILE.html.
      for run in "0p6b-sl8192-mb2 qwen3_0p6b_pretrain_config 8192 2 0.65" \
                 "1b-proxy-sl6144-mb2 qwen3_1b_proxy_pretrain_config 6144 2 0.65"; do
        snapshot_run reserve-snapshot $run
      done ;;
    reserve-snapshot-steady)
      # Twentieth session, from the tree of commit 17e0846 (134 s; reserve-snapshot/README.md: the 4B's gaps beside its
      # steady peak are 90 sub-page remainders, 0.52 GiB, the 1.1B proxy's 5). Issue #15: what keeps a gap beside the
      # steady peak, the 1.17 GiB envelope the first-step and steady-peak rules count and most of what auto's step
      # goal misses by (planner-auto-5/README.md). Two of
      # planner-auto-5's runs again on the whole device, with the allocator's history of steps 1-2: Qwen3-4B at 6144
      # tokens, fraction 0.45, which kept 0.55 GiB beyond its peak (its 0.4 run died with 0.53 GiB reserved and
      # unused), and the 1.1B proxy at 8192 tokens, fraction 0.45, which kept 0.04. Compare each peak_reserved_gib
      # with planner-auto-5's before reading the histories (reserve-snapshot/holes.py reads them; its `stuck` column
      # is what a full device keeps of the gaps: their partial 20 MiB pages, reserve-snapshot/README.md).
      for run in "4b-sl6144-fraction-0.45 qwen3_4b_pretrain_config 6144 1 0.45 model.tensor_model_parallel_size=1" \
                 "1b-proxy-sl8192-fraction-0.45 qwen3_1b_proxy_pretrain_config 8192 1 0.45"; do
        snapshot_run reserve-snapshot-steady $run
      done ;;
    reserve-snapshot-order)
      # Twenty-fifth session (issue #15, reserve-snapshot/order/, one H100, 191 s): when each NCCL communicator is made, against the allocator's history (NCCL's
      # INIT lines timestamped on the history's clock, snapshot_run). Two open questions of reserve-snapshot/README.md:
      # - the dense first-step rule assumes the step-1 communicators come before the GPU part's Adam moments; the logs
      #   so far had no times to show it (the 1.1B proxy at 8192 tokens, fraction 0.45, as reserve-snapshot-steady);
      # - the MoE proxy makes more communicators in step 2 (alloc-tight/, by their size; three in this run). If they come before
      #   step 2's loss grows the segment, the hole that growth leaves costs no device memory and the first-step and
      #   full-device rules can apply to MoE models, whose plans count the loss's block beside the steady peak today
      #   (+3.0 % to +7.1 % on the whole device of planner-accuracy.md's MoE rows). The 3-layer proxy at 8192 tokens,
      #   fraction 0.7, is planner-auto-4's auto run (moe-proxy-3-sl8192/auto).
      # Read them with: python docs/benchmarks/reserve-snapshot/holes.py reserve-snapshot-order-*.pickle.gz (each
      # beside its NAME.log, copied from $RUNS/reserve-snapshot-order/).
      for run in "moe-proxy-3-sl8192-fraction-0.7 qwen3_30b_a3b_proxy_pretrain_config 8192 1 0.7 model.num_layers=3" \
                 "1b-proxy-sl8192-fraction-0.45 qwen3_1b_proxy_pretrain_config 8192 1 0.45"; do
        snapshot_run reserve-snapshot-order $run
      done ;;
    smallest-trains)
      # Twentieth session (issue #15, docs/benchmarks/smallest-trains/, from the tree of commit 17e0846): planner-auto-5's
      # four configurations whose lowest run still trained, walked on down one 0.05 step per run beside the same
      # ballast until a run did not train: the smallest fraction that trains on each device (smallest-trains/run.py).
      # Three calls: CASES=1p7b-sl10240 (115 s), CASES="1p7b-sl4096-mb3 1b-proxy-sl8192" (264 s), CASES=0p6b-sl12288
      # (cut at 250 s in its run at 0.05; finished with the case's first fraction set to 0.05 on the device copy, 113 s).
      $py docs/benchmarks/smallest-trains/run.py "$runs" ${CASES:-} ;;
    planner-auto-3)
      # Fourteenth session (issue #15, docs/benchmarks/planner-auto-3/, at commit d4bd549): auto with the reserve
      # measured with expandable segments, on configurations never run, each pair (auto's fraction, 0.05 below) alone
      # beside its ballast. Ran as the 5 cases (the third cut by the call's limit), then CASES="0p6b-sl2048-mb4
      # 1p7b-sl6144-block8 moe-proxy-5-sl2048-mb2" (538 s). 4b-sl2048-mb2 was refused (check_auto then let the run
      # take the recipe's 2 GPUs; it runs one GPU since): ran in the fifteenth session, at commit 181f30e (179 s),
      # as CASES=4b-sl2048-mb2.
      # planner-auto-2's cases ran without expandable segments and are owed again too.
      mkdir -p "$runs/planner-auto-3"
      for case in ${CASES:-4b-sl2048-mb2 moe-proxy-3-fine-grained-sl4096 0p6b-sl2048-mb4 1p7b-sl6144-block8 moe-proxy-5-sl2048-mb2}; do
        case $case in
          4b-sl2048-mb2) args="81 qwen3_4b_pretrain_config model.tensor_model_parallel_size=1 model.seq_length=2048 \
            dataset.seq_length=2048 train.micro_batch_size=2 train.global_batch_size=2" ;;
          moe-proxy-3-fine-grained-sl4096) args="41 qwen3_30b_a3b_proxy_fine_grained_offload_config model.num_layers=3 \
            model.seq_length=4096 dataset.seq_length=4096" ;;
          0p6b-sl2048-mb4) args="29 qwen3_0p6b_pretrain_config model.seq_length=2048 dataset.seq_length=2048 \
            train.micro_batch_size=4 train.global_batch_size=4" ;;
          1p7b-sl6144-block8) args="42 qwen3_1p7b_pretrain_config model.seq_length=6144 dataset.seq_length=6144 \
            model.recompute_granularity=full model.recompute_method=block model.recompute_num_layers=8" ;;
          moe-proxy-5-sl2048-mb2) args="60 qwen3_30b_a3b_proxy_pretrain_config model.num_layers=5 model.seq_length=2048 \
            dataset.seq_length=2048 train.micro_batch_size=2 train.global_batch_size=2" ;;
          *) echo "unknown case $case"; exit 2 ;;
        esac
        auto_pair "$runs/planner-auto-3" "$case" "$args"
      done ;;
    resume-parity)
      # Fifth session (docs/benchmarks/resume-parity/): ran as `bash docs/benchmarks/resume-parity/run.sh dense`
      # (dense done; moe failed to save on the host's disk). Sixth session, one device call per group:
      # PARTS="moe+dense-signal" (SIGTERM, before exit_signal_handler_for_dataloader was turned on: the workers died),
      # then PARTS="dense-sigterm+dense-sigint+dense-stock" (with gpu-tests beside it), then the rest.
      RUNS=$runs bash docs/benchmarks/resume-parity/run.sh ${PARTS:-dense-sigterm+dense-sigint+dense-stock dense-library-overlap+dense-nondeterministic} ;;
    *) echo "unknown phase $phase"; exit 2 ;;
  esac
  echo "=== $phase done in $(( $(date +%s) - start )) s"
  save_phase "$phase"
done
