"""The admissible values of offload keys: the ranges and choices Megatron Core enforces on its own.

Defined once here, at the bottom, because every layer asks: the offload transforms refuse an
out-of-range value, the override layer refuses an out-of-range override, and the validator reports
these ranges as ordinary rules of its table (with the same id, words and fix).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from mbridge_offload.facts.config_tree import get_path, show

# The two keys of optimizer offload that commands set for the user (auto, sweeps): one spelling each.
OFFLOAD_FRACTION_KEY = "optimizer.optimizer_offload_fraction"
OFFLOAD_SWITCH_KEY = "optimizer.optimizer_cpu_offload"

# Megatron Core's accepted fine-grained offload modules (TransformerConfig.__post_init__).
FINE_GRAINED_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm",
                        "expert_fc1", "moe_act", "fused_group_mlp")


@dataclass(frozen=True)
class KeyRange:
    """The values one dotted key admits. Each check reads the whole config (a range may depend on
    another key, e.g. ``model.num_layers``)."""

    id: str
    key: str
    text: str
    holds: Callable[[Any], bool]
    fix: Callable[[Any], str]  # a constant fix ignores the config (the docs table passes None)
    observed: Callable[[Any], str] | None = None  # the value to show, when not the key's own
    fix_text: str = ""  # the fix in the docs table, where ``fix`` depends on the config

    def value(self, cfg: Any) -> str:
        if self.observed is not None:
            return self.observed(cfg)
        return show(get_path(cfg, self.key))


def fixed(text: str) -> Callable[[Any], str]:
    """A fix that is the same whatever the config."""
    return lambda _: text


def offload_modules(cfg: Any) -> set[str]:
    """The fine-grained offload modules a config names."""
    return set(cfg.model.offload_modules or [])


def _share(id: str, key: str, of_what: str, fix: str) -> KeyRange:
    return KeyRange(id=id, key=key, text=f"must be a number from 0 to 1: the share of {of_what}",
                    holds=lambda cfg: 0.0 <= get_path(cfg, key) <= 1.0, fix=fixed(fix))


def _not_negative(id: str, key: str, note: str, fix: str) -> KeyRange:
    return KeyRange(id=id, key=key, text=f"must be >= 0 ({note})", holds=lambda cfg: get_path(cfg, key) >= 0,
                    fix=fixed(fix))


OPTIMIZER_OFFLOAD_FRACTION = _share(
    "optimizer-offload/fraction-range", OFFLOAD_FRACTION_KEY,
    "optimizer states (and their Adam step) moved to the CPU", fix="optimizer.optimizer_offload_fraction=0.5")

CPU_OFFLOADING_NUM_LAYERS = KeyRange(
    id="activation-offload/num-layers-range", key="model.cpu_offloading_num_layers",
    text="must satisfy 0 <= cpu_offloading_num_layers < model.num_layers",
    holds=lambda cfg: 0 <= cfg.model.cpu_offloading_num_layers < cfg.model.num_layers,
    fix=lambda cfg: ("model.cpu_offloading_num_layers="
                     f"{max(0, min(cfg.model.cpu_offloading_num_layers, cfg.model.num_layers - 1))}"),
    observed=lambda cfg: f"{cfg.model.cpu_offloading_num_layers} (model.num_layers={cfg.model.num_layers})",
    fix_text="model.cpu_offloading_num_layers=<n below model.num_layers>")

OFFLOAD_MODULES_KNOWN = KeyRange(
    id="fine-grained/modules-known", key="model.offload_modules",
    text="each module must be one of " + ", ".join(FINE_GRAINED_MODULES),
    holds=lambda cfg: offload_modules(cfg) <= set(FINE_GRAINED_MODULES),
    fix=lambda cfg: ("model.offload_modules=["
                     + ",".join(sorted(offload_modules(cfg) & set(FINE_GRAINED_MODULES)) or ["expert_fc1", "moe_act"])
                     + "]"),
    fix_text="model.offload_modules=[expert_fc1,moe_act]")

ACTIVATION_OFFLOAD_FRACTION = _share(
    "fine-grained/fraction-range", "model.activation_offload_fraction",
    "eligible activations offloaded", fix="model.activation_offload_fraction=1.0")

MIN_OFFLOADED_TENSOR_SIZE = _not_negative(
    "fine-grained/min-tensor-size", "model.min_offloaded_tensor_size",
    "bytes; smaller tensors stay on the GPU", fix="model.min_offloaded_tensor_size=1048576")

DELTA_OFFLOAD_BYTES_ACROSS_PP_RANKS = _not_negative(
    "fine-grained/pp-balance", "model.delta_offload_bytes_across_pp_ranks",
    "bytes", fix="model.delta_offload_bytes_across_pp_ranks=0")

KEY_RANGES: tuple[KeyRange, ...] = (
    OPTIMIZER_OFFLOAD_FRACTION, CPU_OFFLOADING_NUM_LAYERS, OFFLOAD_MODULES_KNOWN,
    ACTIVATION_OFFLOAD_FRACTION, MIN_OFFLOADED_TENSOR_SIZE, DELTA_OFFLOAD_BYTES_ACROSS_PP_RANKS,
)


def range_violations(cfg: Any, keys: Iterable[str]) -> list[tuple[KeyRange, str, str]]:
    """The ranges of ``keys`` that ``cfg`` breaks: (range, value shown, fix)."""
    keys = set(keys)
    return [(key_range, key_range.value(cfg), key_range.fix(cfg)) for key_range in KEY_RANGES
            if key_range.key in keys and not key_range.holds(cfg)]
