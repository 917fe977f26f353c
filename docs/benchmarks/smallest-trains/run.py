"""Where does each planner-auto-5 configuration stop training? (issue #15)

planner-auto-5/ ran each configuration at auto's fraction and one or two 0.05 steps below; on four of five the lowest
run still trained, so the smallest fraction that trains on that device was not known. This walks on down, one 0.05
step per run, each run alone beside the same ballast (the same device size), until a run does not train or fraction 0
has trained. The result is a fixed ground truth for the step goal (auto at most one step above the smallest fraction
that trains) that any planner's pick on these devices can be read against without a new run.

    python3 docs/benchmarks/smallest-trains/run.py RUNS_DIR [CASE ...]     (no CASE: all, in CASES' order)
"""

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from mbridge_offload.bench.auto_check import launch_arguments, outcome_of
from mbridge_offload.bench.device_ballast import Ballast
from mbridge_offload.bench.sweep import run_one
from mbridge_offload.planning.fraction_search import AUTO_STEP


@dataclass(frozen=True, kw_only=True)
class WalkDown:
    device_gib: float  # planner-auto-5's device for this configuration
    recipe: str
    overrides: tuple[str, ...]
    first_fraction: float  # one step below the lowest fraction planner-auto-5 ran there (it trained)


def tokens(n: int, micro_batch: int = 1) -> tuple[str, ...]:
    return (f"model.seq_length={n}", f"dataset.seq_length={n}", f"train.micro_batch_size={micro_batch}",
            f"train.global_batch_size={micro_batch}", "train.train_iters=3")


# the 4B's walk ended in planner-auto-5 (0.4 ran out of memory); the shortest walks first, so a cut call keeps most
CASES = {
    "1p7b-sl10240": WalkDown(device_gib=59.2, recipe="qwen3_1p7b_pretrain_config", overrides=tokens(10240),
                             first_fraction=0.35),
    "1p7b-sl4096-mb3": WalkDown(device_gib=65.5, recipe="qwen3_1p7b_pretrain_config", overrides=tokens(4096, 3),
                                first_fraction=0.35),
    "1b-proxy-sl8192": WalkDown(device_gib=35.6, recipe="qwen3_1b_proxy_pretrain_config", overrides=tokens(8192),
                                first_fraction=0.35),
    "0p6b-sl12288": WalkDown(device_gib=38.3, recipe="qwen3_0p6b_pretrain_config", overrides=tokens(12288),
                             first_fraction=0.3),
}


def main() -> None:
    runs = Path(sys.argv[1]) / "smallest-trains"
    runs.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[2:] or list(CASES):
        case = CASES[name]
        fraction = case.first_fraction
        while fraction >= 0:
            run_name = f"{name}/fraction-{fraction:g}"
            with Ballast(case.device_gib, runs / f"ballast-{name}-{fraction:g}.log") as ballast:
                result = run_one(case.recipe, fraction, runs / run_name, list(case.overrides),
                                 launch_arguments(case.device_gib), timeout_s=300)
                strangers = ballast.strangers()
            outcome = outcome_of({**result, "fraction": fraction}, case.device_gib, ballast.state["held_gib"],
                                 ballast.process.pid, strangers)
            line = {"case": name, "device_gib": case.device_gib, **asdict(outcome), "wall_s": result["wall_s"]}
            print(json.dumps(line), flush=True)
            with (runs / "results.jsonl").open("a") as out:
                out.write(json.dumps(line) + "\n")
            if outcome.outcome != "trained":
                break
            fraction = round(fraction - AUTO_STEP, 2)


if __name__ == "__main__":
    main()
