"""Does a run need the allocator's reserve when the device is tight? (issue #15)

With expandable segments, the caching allocator's reserve (peak reserved - peak allocated) is free memory inside its
segment. When an allocation does not fit, PyTorch releases its cached free blocks and tries again; with expandable
segments that unmaps the free pages inside the segment too. If so, a device only a little larger than PyTorch's peak
allocated + the memory outside PyTorch trains, although the same run on a large device reserved up to 1.17 GiB more.
Each case reruns an alloc-conf/ run with the largest reserves, beside a ballast that leaves spare_gib above that
run's peak allocated + outside PyTorch (from its committed metrics).

    python3 docs/benchmarks/alloc-tight/run.py RUNS_DIR [CASE ...]     (no CASE: the two that ran)
"""

import contextlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from mbridge_offload.bench.device_ballast import Ballast
from mbridge_offload.bench.sweep import run_one
from mbridge_offload.facts.run_records import read_steps


@dataclass(frozen=True, kw_only=True)
class TightCase:
    recipe: str
    overrides: tuple[str, ...]
    fraction: float
    repeats: str  # the committed run (under docs/benchmarks/) whose peak sets the device size
    spare_gib: float = 0.25  # the device: that run's peak allocated + memory outside PyTorch + this
    env: tuple[tuple[str, str], ...] = ()  # set for this run only
    launch_args: tuple[str, ...] = ()  # run_recipe options besides --num-gpus 1


DENSE_FRACTION_1 = dict(recipe="qwen3_1b_proxy_pretrain_config", fraction=1.0,
                        overrides=("train.train_iters=4", "optimizer.overlap_cpu_optimizer_d2h_h2d=True"),
                        repeats="alloc-conf/calibration/1b-proxy-fraction-1")
SMALL_DENSE_SL8192_MB2 = dict(recipe="qwen3_0p6b_pretrain_config", repeats="planner-auto-4/0p6b-sl8192-mb2/auto",
                              overrides=("train.train_iters=4", "model.seq_length=8192", "dataset.seq_length=8192",
                                         "train.micro_batch_size=2", "train.global_batch_size=2"))
NCCL_ALLOCATIONS_LOGGED = (("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "INIT,ALLOC"))
CASES = {
    "1b-proxy-fraction-1": TightCase(**DENSE_FRACTION_1),
    "moe-proxy-2-fine-grained-sl8192": TightCase(
        recipe="qwen3_30b_a3b_proxy_fine_grained_offload_config", fraction=0.0,
        overrides=("train.train_iters=4", "model.num_layers=2", "model.seq_length=8192", "dataset.seq_length=8192",
                   "train.micro_batch_size=1", "train.global_batch_size=1"),
        repeats="alloc-conf/shell-env/moe-proxy-2-fine-grained-sl8192"),
    # ran in the fifteenth session: the dense failure again with NCCL's own account of its initialisation and
    # allocations (a communicator made in step 1 found the device full)
    "1b-proxy-fraction-1-nccl-debug": TightCase(**DENSE_FRACTION_1,
                                                env=NCCL_ALLOCATIONS_LOGGED),
    # ran in the fifteenth session: every communicator created before step 1 (21 of 0.379 GiB: PyTorch ran out)
    "1b-proxy-fraction-1-warm-communicators": TightCase(**DENSE_FRACTION_1, env=NCCL_ALLOCATIONS_LOGGED,
                                                        launch_args=("--warm-communicators",)),
    # ran in the sixteenth session: can a communicator be made cheap? NCCL through cudaMalloc instead of cuMem (which puts each
    # channel's 608, 24 and 4 bytes in 2 MiB pages of their own), and fewer channels; first on a device 20 GiB
    # larger than needed (what each takes outside PyTorch), then on the tight device, with and without the warm-up
    "1b-proxy-fraction-1-cumem-off-roomy": TightCase(**DENSE_FRACTION_1, spare_gib=20.0,
                                                     env=(*NCCL_ALLOCATIONS_LOGGED, ("NCCL_CUMEM_ENABLE", "0"))),
    "1b-proxy-fraction-1-max-channels-4-roomy": TightCase(**DENSE_FRACTION_1, spare_gib=20.0,
                                                          env=(*NCCL_ALLOCATIONS_LOGGED, ("NCCL_MAX_NCHANNELS", "4"))),
    # ran in the sixteenth session (it trained): the held-out run whose reserve (2.32 GiB, grown in step 2) the plan
    # was short of; on a device 0.25 GiB above its peak allocated + outside PyTorch, does PyTorch take it back?
    "0p6b-sl8192-fraction-1": TightCase(
        recipe="qwen3_0p6b_pretrain_config", fraction=1.0,
        overrides=("train.train_iters=4", "model.seq_length=8192", "dataset.seq_length=8192", "train.micro_batch_size=1",
                   "train.global_batch_size=1", "optimizer.overlap_cpu_optimizer_d2h_h2d=True"),
        repeats="planner-heldout-3/0p6b-sl8192-fraction-1-overlap-on"),
    "1b-proxy-fraction-1-cumem-off": TightCase(**DENSE_FRACTION_1, env=(("NCCL_CUMEM_ENABLE", "0"),)),
    "1b-proxy-fraction-1-cumem-off-warm-communicators": TightCase(**DENSE_FRACTION_1,
                                                                  env=(("NCCL_CUMEM_ENABLE", "0"),),
                                                                  launch_args=("--warm-communicators",)),
    # not run yet: 4 channels took 1.02 GiB outside PyTorch on the roomy device, 1.41 less than 64; on the tight
    # device sized from the 64-channel run, does the dense case then train (the three step-1 communicators need
    # 0.08 GiB instead of 1.14)?
    "1b-proxy-fraction-1-max-channels-4": TightCase(**DENSE_FRACTION_1, env=(("NCCL_MAX_NCHANNELS", "4"),)),
    # nineteenth session, trained (reserve-snapshot/README.md): planner-auto-4's 0.6B auto run kept a 3.08 GiB hole
    # beside its peak, formed in step 2 after all of its communicators. On a device 0.25 GiB above its peak
    # allocated + outside PyTorch (43.98 GiB, 4.4 below its plan), does PyTorch take the hole back as it did at
    # fraction 1?
    "0p6b-sl8192-mb2-fraction-0.65": TightCase(**SMALL_DENSE_SL8192_MB2, fraction=0.65),
    # nineteenth session, trained: what auto picks with the first-step reserve rule on planner-auto-4's 49.5 GiB device
    # for the same model (the default rule picks 0.65): no optimizer offload, 44.25 GiB planned peak allocated +
    # 2.43 outside PyTorch, so the device holds it with ~2.8 GiB to spare, less than the 4.64 GiB block
    "0p6b-sl8192-mb2-fraction-0": TightCase(**SMALL_DENSE_SL8192_MB2, fraction=0.0, spare_gib=49.5 - 43.73),
}


def needed_gib(committed: str) -> tuple[float, float]:
    """(peak allocated + outside PyTorch, peak reserved + outside) of the committed run's largest step."""
    rows = read_steps(Path("docs/benchmarks", committed))[0]
    allocated = max(r["peak_allocated_gib"] + r["device_outside_pytorch_gib"] for r in rows)
    reserved = max(r["peak_reserved_gib"] + r["device_outside_pytorch_gib"] for r in rows)
    return allocated, reserved


@contextlib.contextmanager
def environment(variables: dict[str, str]):
    """The run's process inherits these; the next case does not."""
    before = {key: os.environ.get(key) for key in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def main() -> None:
    runs = Path(sys.argv[1]) / "alloc-tight"
    runs.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[2:] or ["1b-proxy-fraction-1", "moe-proxy-2-fine-grained-sl8192"]:
        case = CASES[name]
        allocated, reserved = needed_gib(case.repeats)
        device = round(allocated + case.spare_gib, 2)
        with Ballast(device, runs / f"ballast-{name}.log") as ballast, environment(dict(case.env)):
            result = run_one(case.recipe, case.fraction, runs / name, list(case.overrides),
                             ["--num-gpus", "1", *case.launch_args],
                             timeout_s=400)
        line = {"case": name, "device_gib": device, "committed_allocated_plus_outside_gib": round(allocated, 3),
                "committed_reserved_plus_outside_gib": round(reserved, 3), "ballast": ballast.state,
                "returncode": result["returncode"], "reason": result.get("reason"), "wall_s": result["wall_s"]}
        print(json.dumps(line), flush=True)
        with (runs / "results.jsonl").open("a") as out:
            out.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
