"""Runs stream_cpu_scenarios.py's scenarios in a process of its own (the CPU stand-in for the GPU changes torch for
the whole process): ``python tests/runtime/stream_cpu_check.py KIND``, KIND one of ranks, resume, fetch-ahead,
bf16-moments, exact-ranks and delayed-ranks (with the exact and the delayed engine), exact-by-region and
delayed-by-region (the same engines with the gradient buffers zeroed by region, runtime/grad_regions.py),
delayed-next-step and delayed-next-step-by-region (delayed-ranks' and delayed-by-region's scenarios with the delayed
engine's copies handed over at the next step's zeroing, MBRIDGE_OFFLOAD_DELAYED_COPY_START=next-step). Prints one line
per scenario and ALL OK or FAILED; exits 0 only when every scenario ended as it should.

The scenarios live in a module of their own: dist_checkpointing's save starts a process with the spawn method,
which imports this script again (as __mp_main__); importing it must not set everything up a second time."""

import os
import sys

if __name__ == "__main__":
    # installed when the module is imported
    engine_of = {"exact-ranks": "exact", "delayed-ranks": "delayed", "exact-by-region": "exact",
                 "delayed-by-region": "delayed"}
    if sys.argv[1] in engine_of:
        os.environ["MBRIDGE_CPU_CHECK_ENGINE"] = engine_of[sys.argv[1]]
    if sys.argv[1].endswith("-by-region"):
        os.environ["MBRIDGE_OFFLOAD_ZERO_BY_REGION"] = "on"
    # the delayed engine's copies handed over at the next step's zeroing: the delayed kinds' scenarios with it on
    next_step = {"delayed-next-step": "delayed-ranks", "delayed-next-step-by-region": "delayed-by-region"}
    kind = sys.argv[1]
    if kind in next_step:
        os.environ["MBRIDGE_CPU_CHECK_ENGINE"] = "delayed"
        os.environ["MBRIDGE_OFFLOAD_DELAYED_COPY_START"] = "next-step"
        kind = next_step[kind]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import stream_cpu_scenarios

    sys.exit(stream_cpu_scenarios.main([kind, *sys.argv[2:]]))
