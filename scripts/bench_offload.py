#!/usr/bin/env python3
"""Stock vs tuned optimizer offload, against the floor this host allows, in one invocation.

    uv run scripts/bench_offload.py --recipe qwen3_1b_proxy_pretrain_config --out runs/bench-1b \\
        --fractions 0.25,0.5,0.75,1

First measures the host (scripts/measure_host.py: pinned copy bandwidth, memory bandwidth, CPU Adam
speed), then, in 3 interleaved rounds (``--repeats``), trains the no-offload baseline (``--baseline-runs``,
one per round: each slowdown is against baselines of the same run, and they give the loss noise floor)
and, for each fraction, each configuration in a fresh process, each run of at least 30 measured steps
(``train.train_iters=33`` unless given; fewer only with ``--short-runs``). Each round starts the configurations
one place further on (the baseline always first; the fractions keep their order): with as many rounds as
configurations, or a multiple, each takes every place equally often, and a host that drifts through the bench
favours none of them (the bench says so when the rounds are not a multiple):

- stock, all cores: the library's defaults (D2H/H2D overlap off) with every core of the host, what a
  node running one rank gets;
- stock, 1 thread: the same with 1 CPU thread, what torchrun gives each rank of a node running several;
- overlap on: stock, all cores, with D2H/H2D overlap on (what the overlap switch alone does);
- overlap chunked: overlap on, in 8 chunks (``--overlap-chunks 8``, mbridge_offload/runtime/chunked_overlap.py);
- tuned: run_recipe.py's offload tuning (mbridge_offload/runtime/offload_tuning.py, CPU threads per rank). When the
  recipe runs one rank per node, tuned resolves to exactly one of the configurations above (today
  overlap chunked: all cores, overlap on in 8 chunks, pinned buffers): its row then reuses that run,
  marked ``same_run_as``;
- engine-exact / engine-delayed (chosen with --configs): tuned, with the streaming offload engine's mode
  (mbridge_offload/runtime/streaming_engine.py); engine-exact-one-piece / engine-delayed-one-piece: the same with
  one piece of their copies in flight instead of two (MBRIDGE_OFFLOAD_COPY_PIECES_IN_FLIGHT=1);
  engine-exact-by-region / engine-delayed-by-region: the same with the gradient buffers zeroed by region
  (MBRIDGE_OFFLOAD_ZERO_BY_REGION=on, mbridge_offload/runtime/grad_regions.py); engine-delayed-copies-next-step:
  engine-delayed with each step's gradient copies started at the next step's gradient zeroing
  (MBRIDGE_OFFLOAD_DELAYED_COPY_START=next-step); engine-exact-spaced / engine-delayed-spaced: every piece of
  their copies enqueued at once, each after a GPU-side pause of about 20 us (MBRIDGE_OFFLOAD_COPY_PIECE_PAUSE_US=20);
  engine-delayed-copies-next-step-spaced: both.

``--max-baseline-cv P`` stops the bench after the first baseline it runs (exit code 3) when that run's steady-state
steps vary more than P % (standard deviation over the median step): a host that noisy cannot size a small slowdown,
and the other runs would only spend its time. ``--resume`` checks the first baseline it runs anew.

The goal lines call a goal "undecided" where the rounds, each against its own baseline, fall on both sides of it,
or (one round) where the goal lies inside the identical baselines' spread of the slowdown; where the rounds all fall
on one side, that side decides "met" or "not met".

``--deterministic`` launches every run bit-reproducible (run_recipe.py --deterministic): identical runs then take
the same path (on the MoE proxy the same expert routing, which sets its step time), and loss parity is judged at the
seed's 0.001 exactly.

Writes DIR/offload_overhead.json (rows: fraction, config, cpu_threads_per_rank, step_time_s,
slowdown_vs_baseline, floor_s, the per-step breakdown, loss delta), DIR/offload_overhead.md, and
every run's folder. The floor (mbridge_offload/planning/cost_model.py) is the best step time the bytes of that
fraction allow on this host; the goals of the performance issue are checked against it.
The command is mbridge_offload/cli/bench_offload.py, also run as ``python -m mbridge_offload.cli.bench_offload``.
"""

import sys

from mbridge_offload.cli.bench_offload import main

if __name__ == "__main__":
    sys.exit(main())
