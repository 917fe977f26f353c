#!/usr/bin/env bash
# Resume parity on the H200 (issue #13): save at step k, resume to 2k, compare with the uninterrupted 2k run,
# in deterministic mode. Run from the repository root after the offline install (../shared/gpu/README.md):
#   bash docs/benchmarks/resume-parity/run.sh GROUP [GROUP ...]    GROUP: PART or PART+PART+... (run side by side
#   on the one GPU: deterministic results do not depend on what else runs; their speed is not measured here)
#   PART: dense | dense-sigterm | dense-sigint | dense-stock | dense-library-overlap | dense-nondeterministic | moe
# Results under $RUNS/resume-parity/<part>/ (resume_parity.json and .md, each run's metrics and log), and each
# part's console output in $RUNS/resume-parity/<part>.log. Checkpoints are removed once compared.
source docs/benchmarks/case_runner.sh
dense=(--recipe qwen3_1b_proxy_pretrain_config --save-at 5)
run_part() {
  local part=$1
  echo "=== $part $(date +%T)"
  case $part in
    dense)  # tuned (overlap in 8 chunks), the default
      $py scripts/check_resume.py "${dense[@]}" --fractions 0.5,1 --deterministic --out "$runs/resume-parity/dense" \
        model.num_layers=4 ;;
    dense-sigterm|dense-sigint)  # stopped as a preempted job (SIGTERM) or Ctrl-C (SIGINT) stops it, after step 5
      $py scripts/check_resume.py "${dense[@]}" --fractions 0.5 --deterministic --stop-by "${part#dense-}" \
        --out "$runs/resume-parity/$part" model.num_layers=4 ;;
    dense-stock)  # the library's path, overlap off
      $py scripts/check_resume.py "${dense[@]}" --fractions 1 --deterministic --offload-tuning stock \
        --out "$runs/resume-parity/dense-stock" model.num_layers=4 ;;
    dense-library-overlap)  # the library's path with its per-tensor overlap
      $py scripts/check_resume.py "${dense[@]}" --fractions 1 --deterministic --offload-tuning stock \
        --out "$runs/resume-parity/dense-library-overlap" model.num_layers=4 optimizer.overlap_cpu_optimizer_d2h_h2d=True ;;
    moe)
      # 2 layers: the 4-layer proxy's checkpoint (~56 GB) did not fit the host's 64 GiB disk beside the dense
      # ones (docs/benchmarks/resume-parity/moe-disk-full/)
      $py scripts/check_resume.py --recipe qwen3_30b_a3b_proxy_pretrain_config --save-at 5 --fractions 0.5 \
        --deterministic --out "$runs/resume-parity/moe" model.num_layers=2 ;;
    dense-nondeterministic)
      $py scripts/check_resume.py "${dense[@]}" --fractions 0.5 --out "$runs/resume-parity/dense-nondeterministic" \
        model.num_layers=4 ;;
    *) echo "unknown part $part"; return 2 ;;
  esac
  echo "=== $part done $(date +%T)"
}
run_side_by_side "$runs/resume-parity" run_part 12 "$@"
