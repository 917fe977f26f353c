#!/usr/bin/env bash
# Resume parity on the H200 (issue #13): save at step k, resume to 2k, compare with the uninterrupted 2k run,
# in deterministic mode. Run from the repository root after the offline install (../shared/gpu/README.md):
#   bash docs/benchmarks/resume-parity/run.sh PART [PART ...]     PART: dense | dense-stock | moe | dense-nondeterministic
# Results under $RUNS/resume-parity/<part>/ (resume_parity.json and .md, each run's metrics and log).
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
runs=${RUNS:-/tmp/runs}
py=${PYTHON:-python3}
dense=(--recipe qwen3_1b_proxy_pretrain_config --save-at 5)
for part in "$@"; do
  echo "=== $part $(date +%T)"
  case $part in
    dense)  # tuned (overlap in 8 chunks), the default
      $py scripts/check_resume.py "${dense[@]}" --fractions 0.5,1 --deterministic --out "$runs/resume-parity/dense" \
        model.num_layers=4 ;;
    dense-stock)  # the library's path: overlap off, then the library's per-tensor overlap
      $py scripts/check_resume.py "${dense[@]}" --fractions 1 --deterministic --offload-tuning stock \
        --out "$runs/resume-parity/dense-stock" model.num_layers=4
      $py scripts/check_resume.py "${dense[@]}" --fractions 1 --deterministic --offload-tuning stock \
        --out "$runs/resume-parity/dense-library-overlap" model.num_layers=4 optimizer.overlap_cpu_optimizer_d2h_h2d=True ;;
    moe)
      # 2 layers: the 4-layer proxy's checkpoint did not fit the host's 64 GiB disk beside the dense ones
      # (docs/benchmarks/resume-parity/moe-disk-full/); earlier parts' checkpoints are removed first
      rm -rf "$runs"/resume-parity/*/fraction-*/checkpoint
      $py scripts/check_resume.py --recipe qwen3_30b_a3b_proxy_pretrain_config --save-at 5 --fractions 0.5 \
        --deterministic --out "$runs/resume-parity/moe" model.num_layers=2 ;;
    dense-nondeterministic)
      $py scripts/check_resume.py "${dense[@]}" --fractions 0.5 --out "$runs/resume-parity/dense-nondeterministic" \
        model.num_layers=4 ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
  echo "=== $part done $(date +%T)"
done
