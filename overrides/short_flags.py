"""Short flags for the keys users change most (like upstream's -tp/-pp/-gb). Each expands into
dotted overrides; a dotted override of the same key wins over the short flag."""

from __future__ import annotations

from dataclasses import dataclass

from overrides.grammar import key_of


@dataclass(frozen=True)
class ShortFlag:
    flags: tuple[str, ...]
    keys: tuple[str, ...]
    help: str
    type: type = int


SHORT_FLAGS: tuple[ShortFlag, ...] = (
    ShortFlag(("-tp", "--tensor-parallel"), ("model.tensor_model_parallel_size",), "tensor parallel size"),
    ShortFlag(("-pp", "--pipeline-parallel"), ("model.pipeline_model_parallel_size",), "pipeline parallel size"),
    ShortFlag(("-cp", "--context-parallel"), ("model.context_parallel_size",), "context parallel size"),
    ShortFlag(("-ep", "--expert-parallel"), ("model.expert_model_parallel_size",), "expert parallel size"),
    ShortFlag(("-gb", "--global-batch-size"), ("train.global_batch_size",), "global batch size"),
    ShortFlag(("-mb", "--micro-batch-size"), ("train.micro_batch_size",), "micro batch size"),
    ShortFlag(("-ti", "--train-iters"), ("train.train_iters",), "training iterations"),
    ShortFlag(("-sl", "--seq-length"), ("model.seq_length", "dataset.seq_length"),
              "sequence length (model and dataset)"),
    ShortFlag(("-of", "--offload-fraction"), ("optimizer.optimizer_offload_fraction",),
              "optimizer offload fraction (0..1, or auto: the smallest that fits); turns optimizer offload "
              "on (> 0) or off (0)", str),
)


def dest(flag: ShortFlag) -> str:
    return flag.flags[-1].lstrip("-").replace("-", "_")


def to_overrides(values: dict[str, object], dotted: list[str]) -> list[str]:
    """Overrides for the short flags given (``values`` by argparse dest), minus keys given dotted."""
    given = {key_of(text) for text in dotted}
    out = []
    for flag in SHORT_FLAGS:
        value = values.get(dest(flag))
        if value is None:
            continue
        for key in flag.keys:
            if key not in given:
                out.append(f"{key}={value}")
        # The fraction means nothing without the switch: -of turns offload on (> 0) or off (0);
        # for "auto" the planner sets both.
        if flag.keys == ("optimizer.optimizer_offload_fraction",) and "optimizer.optimizer_cpu_offload" not in given:
            try:
                out.append(f"optimizer.optimizer_cpu_offload={float(value) > 0}")
            except ValueError:
                pass  # "auto", or a typo the override layer reports with the key
    return out
