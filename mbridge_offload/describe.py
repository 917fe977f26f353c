"""What a config does, in words: the offload settings in force and what differs from a recipe."""

from __future__ import annotations

from typing import Any, Iterator

from mbridge_offload.facts.config_tree import same_value, show, walk
from mbridge_offload.facts.parallel import ParallelSizes


def offload_summary(cfg: Any) -> list[str]:
    """One line per offload mechanism, saying whether it is on and with what settings."""
    opt, model = cfg.optimizer, cfg.model
    lines = []
    if opt.optimizer_cpu_offload:
        lines.append(f"optimizer offload: ON, {opt.optimizer_offload_fraction:.0%} of optimizer states on the CPU, "
                     f"D2H/H2D overlap {'on' if opt.overlap_cpu_optimizer_d2h_h2d else 'off'}, "
                     f"pinned grads/params {'on' if opt.pin_cpu_grads else 'off'}/{'on' if opt.pin_cpu_params else 'off'}")
    else:
        lines.append("optimizer offload: off")
    if model.cpu_offloading:
        what = [w for w, on in (("activations", model.cpu_offloading_activations),
                                ("weights", model.cpu_offloading_weights)) if on]
        lines.append(f"activation offload (layer-level): ON, {model.cpu_offloading_num_layers} of "
                     f"{model.num_layers} layers, offloading {' and '.join(what) or 'nothing'}"
                     f"{', double buffering' if model.cpu_offloading_double_buffering else ''}")
    else:
        lines.append("activation offload (layer-level): off")
    if model.fine_grained_activation_offloading:
        lines.append(f"fine-grained activation offload: ON, modules {', '.join(model.offload_modules or [])}, "
                     f"fraction {model.activation_offload_fraction:g}")
    else:
        lines.append("fine-grained activation offload: off")
    return lines


def topology(cfg: Any, num_gpus: int) -> str:
    m = cfg.model
    sizes = ParallelSizes.of(m, num_gpus)
    dp = "DP?" if sizes.dp is None else f"DP{sizes.dp}"
    return (f"{num_gpus} GPU{'s' if num_gpus != 1 else ''}: TP{m.tensor_model_parallel_size} "
            f"PP{m.pipeline_model_parallel_size} CP{m.context_parallel_size} {dp} "
            f"EP{m.expert_model_parallel_size} ETP{m.expert_tensor_parallel_size}")


def _leaves(cfg: Any) -> Iterator[tuple[str, Any]]:
    """(key, value) of every setting four levels deep, ``env_vars`` entries included; not functions."""
    for key, value, is_section in walk(cfg, levels=4, into_dict=lambda key: key.rsplit(".", 1)[-1] == "env_vars"):
        if not is_section and (not callable(value) or isinstance(value, type)):
            yield key, value


def config_diff(before: Any, after: Any) -> list[tuple[str, Any, Any]]:
    """(key, old, new) for every leaf value that differs between two configs."""
    old = dict(_leaves(before))
    new = dict(_leaves(after))
    missing = object()
    diffs = []
    for key in list(old) + [k for k in new if k not in old]:
        a, b = old.get(key, missing), new.get(key, missing)
        if not same_value(a, b):
            diffs.append((key, "(unset)" if a is missing else a, "(unset)" if b is missing else b))
    return diffs


def format_diff(diffs: list[tuple[str, Any, Any]]) -> list[str]:
    return [f"{key}: {show(a)} -> {show(b)}" for key, a, b in diffs]
