"""The admissible values of single keys: the offload keys' ranges and choices Megatron Core enforces on its own, the
sizes rules and the planner divide by, and the training hyperparameters nothing upstream checks before the launch.

Defined once here, at the bottom, because every layer asks: the offload transforms refuse an
out-of-range value, the override layer refuses an out-of-range override, and the validator reports
these ranges as ordinary rules of its table (with the same id, words and fix).
"""

from __future__ import annotations

import math
import re
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
    number: bool = True  # the key takes a number: any text it holds is shown as text, quoted

    def value(self, cfg: Any) -> str:
        if self.observed is not None:
            return self.observed(cfg)
        return show_typed(get_path(cfg, self.key), number=self.number)


# text a reader would take for a number, a bool, null, a list or a dict when shown bare
_READS_AS_ANOTHER_TYPE = re.compile(
    r"(?i:[+-]?(\d[\d_]*\.?\d*|\.\d+)(e[+-]?\d+)?|[+-]?(inf|infinity|nan)|0[xob][0-9a-f_]+|true|false|null)"
    r"|None|[\[{'\"].*", re.DOTALL)


def show_typed(value: Any, number: bool = False) -> str:
    """``value`` for a report, its type seen where the bare text would hide it: text that reads as a number, a bool,
    null, a list or a dict, or that is empty or has spaces at an end, is shown quoted as text (the string '16', not
    16: ``train.micro_batch_size='16'`` is refused because it is text). ``number``: the key takes a number, so any
    text is shown that way."""
    if isinstance(value, str):
        if number or value != value.strip() or not value or _READS_AS_ANOTHER_TYPE.fullmatch(value):
            return f"the string {value!r}"
        return value
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(repr(v) if isinstance(v, str) and show_typed(v) != v else show_typed(v)
                              for v in value) + "]"
    return show(value)


def fixed(text: str) -> Callable[[Any], str]:
    """A fix that is the same whatever the config."""
    return lambda _: text


def offload_modules(cfg: Any) -> set[str]:
    """The fine-grained offload modules a config names (as text; a single name counts as one module)."""
    modules = cfg.model.offload_modules or []
    if isinstance(modules, str):
        modules = [modules]
    try:
        return {str(m) for m in modules}
    except TypeError:  # not a collection: report it as the one (unknown) module it is
        return {str(modules)}


_ABSENT = object()


def value_at(cfg: Any, key: str) -> Any:
    """The value at ``key``, or ``_ABSENT`` where the config has no such key (a range then has nothing to
    check)."""
    try:
        return get_path(cfg, key)
    except (KeyError, AttributeError, TypeError):
        return _ABSENT


def is_number(value: Any) -> bool:
    """A real, finite number (not a bool, not NaN or infinite)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_count(value: Any, low: int = 1, high: int | None = None) -> bool:
    """A whole number (not a bool) from ``low`` to ``high``."""
    return (isinstance(value, int) and not isinstance(value, bool) and value >= low
            and (high is None or value <= high))


def _share(id: str, key: str, of_what: str, fix: str) -> KeyRange:
    def holds(cfg: Any) -> bool:
        value = value_at(cfg, key)
        return value is _ABSENT or (is_number(value) and 0.0 <= value <= 1.0)

    return KeyRange(id=id, key=key, text=f"must be a number from 0 to 1: the share of {of_what}",
                    holds=holds, fix=fixed(fix))


def _not_negative(id: str, key: str, note: str, fix: str) -> KeyRange:
    def holds(cfg: Any) -> bool:
        value = value_at(cfg, key)
        return value is _ABSENT or (is_number(value) and value >= 0)

    return KeyRange(id=id, key=key, text=f"must be >= 0 ({note})", holds=holds, fix=fixed(fix))


def _count(id: str, key: str, high: int, what: str, fix: str, nullable: bool = False) -> KeyRange:
    """A whole number from 1 to ``high`` (or null where the config allows it: the library's default)."""

    def holds(cfg: Any) -> bool:
        value = value_at(cfg, key)
        return value is _ABSENT or (nullable and value is None) or is_count(value, 1, high)

    return KeyRange(id=id, key=key, text=f"must be a whole number from 1 to {high}" + (" or null" if nullable else "")
                    + f" ({what})", holds=holds, fix=fixed(fix))


OPTIMIZER_OFFLOAD_FRACTION = _share(
    "optimizer-offload/fraction-range", OFFLOAD_FRACTION_KEY,
    "optimizer states (and their Adam step) moved to the CPU", fix="optimizer.optimizer_offload_fraction=0.5")

def _num_layers_holds(cfg: Any) -> bool:
    n, layers = value_at(cfg, "model.cpu_offloading_num_layers"), value_at(cfg, "model.num_layers")
    if n is _ABSENT:
        return True
    if not is_count(layers, 1):  # model.num_layers is wrong itself: its own range reports it
        return is_count(n, 0)
    return is_count(n, 0) and n < layers


def _num_layers_fix(cfg: Any) -> str:
    n, layers = value_at(cfg, "model.cpu_offloading_num_layers"), value_at(cfg, "model.num_layers")
    n = n if is_count(n, 0) else 0
    return f"model.cpu_offloading_num_layers={max(0, min(n, layers - 1)) if is_count(layers, 1) else 0}"


CPU_OFFLOADING_NUM_LAYERS = KeyRange(
    id="activation-offload/num-layers-range", key="model.cpu_offloading_num_layers",
    text="must satisfy 0 <= cpu_offloading_num_layers < model.num_layers",
    holds=_num_layers_holds, fix=_num_layers_fix,
    observed=lambda cfg: (f"{show_typed(cfg.model.cpu_offloading_num_layers, number=True)} "
                          f"(model.num_layers={show_typed(cfg.model.num_layers, number=True)})"),
    fix_text="model.cpu_offloading_num_layers=<n below model.num_layers>")

OFFLOAD_MODULES_KNOWN = KeyRange(
    id="fine-grained/modules-known", key="model.offload_modules",
    text="each module must be one of " + ", ".join(FINE_GRAINED_MODULES),
    holds=lambda cfg: offload_modules(cfg) <= set(FINE_GRAINED_MODULES),
    fix=lambda cfg: ("model.offload_modules=["
                     + ",".join(sorted(offload_modules(cfg) & set(FINE_GRAINED_MODULES)) or ["expert_fc1", "moe_act"])
                     + "]"),
    fix_text="model.offload_modules=[expert_fc1,moe_act]", number=False)

ACTIVATION_OFFLOAD_FRACTION = _share(
    "fine-grained/fraction-range", "model.activation_offload_fraction",
    "eligible activations offloaded", fix="model.activation_offload_fraction=1.0")

MIN_OFFLOADED_TENSOR_SIZE = _not_negative(
    "fine-grained/min-tensor-size", "model.min_offloaded_tensor_size",
    "bytes; smaller tensors stay on the GPU", fix="model.min_offloaded_tensor_size=1048576")

DELTA_OFFLOAD_BYTES_ACROSS_PP_RANKS = _not_negative(
    "fine-grained/pp-balance", "model.delta_offload_bytes_across_pp_ranks",
    "bytes", fix="model.delta_offload_bytes_across_pp_ranks=0")

# The sizes every rule and the planner divide by or count over: a zero, a negative, a null where none is
# allowed, or a number past any real model is refused here, by key, instead of failing inside a rule.
# The upper bounds are far above real models and keep the planner's per-layer, per-expert counting bounded.
MAX_PARALLEL = 4096
MAX_LAYERS = 1024
MAX_HEADS = 4096
MAX_EXPERTS = 1024
MAX_WIDTH = 1 << 24
MAX_TOKENS = 1 << 31

def _moe_model(cfg: Any) -> bool:
    return is_count(value_at(cfg, "model.num_moe_experts"), 1)


def _topk_holds(cfg: Any) -> bool:
    """Top-k from 1 to the experts (torch.topk over the router's scores fails beyond them); unread on dense models."""
    topk = value_at(cfg, "model.moe_router_topk")
    return topk is _ABSENT or not _moe_model(cfg) or is_count(topk, 1, value_at(cfg, "model.num_moe_experts"))


def _expert_ffn_holds(cfg: Any) -> bool:
    width = value_at(cfg, "model.moe_ffn_hidden_size")
    return width is _ABSENT or width is None or not _moe_model(cfg) or is_count(width, 1, MAX_WIDTH)


MOE_ROUTER_TOPK = KeyRange(
    id="parallel/topk-range", key="model.moe_router_topk",
    text="on an MoE model, must be a whole number from 1 to model.num_moe_experts (experts each token is routed to)",
    holds=_topk_holds, fix=lambda cfg: "model.moe_router_topk=" + (
        str(min(8, value_at(cfg, "model.num_moe_experts"))) if cfg is not None and _moe_model(cfg) else "8"),
    observed=lambda cfg: (f"{show_typed(value_at(cfg, 'model.moe_router_topk'), number=True)} "
                          f"(experts {show_typed(value_at(cfg, 'model.num_moe_experts'), number=True)})"),
    fix_text="model.moe_router_topk=<1 to num_moe_experts>")

MOE_FFN_HIDDEN_SIZE = KeyRange(
    id="parallel/expert-ffn-range", key="model.moe_ffn_hidden_size",
    text=f"on an MoE model, must be a whole number from 1 to {MAX_WIDTH} or null (an expert's MLP width; null: "
         "model.ffn_hidden_size)", holds=_expert_ffn_holds, fix=fixed("model.moe_ffn_hidden_size=null"))

def _recompute_num_layers_holds(cfg: Any) -> bool:
    """With full recompute, Megatron Core's checkpointed_forward (recompute.py) walks the layers in chunks of this
    many (uniform: 0 or less never ends) or checkpoints this many (block: 0 or less checkpoints none)."""
    if value_at(cfg, "model.recompute_granularity") != "full":
        return True
    n = value_at(cfg, "model.recompute_num_layers")
    return n is _ABSENT or n is None or is_count(n, 1, MAX_LAYERS)


RECOMPUTE_NUM_LAYERS = KeyRange(
    id="parallel/recompute-num-layers-range", key="model.recompute_num_layers",
    text=f"with full recompute, must be a whole number from 1 to {MAX_LAYERS} (layers per checkpointed chunk, "
         "uniform, or checkpointed layers, block; uniform with 0 loops forever in the first forward)",
    holds=_recompute_num_layers_holds, fix=fixed("model.recompute_num_layers=1"))

GRID_RANGES: tuple[KeyRange, ...] = (
    _count("parallel/tp-range", "model.tensor_model_parallel_size", MAX_PARALLEL, "tensor parallel size",
           "model.tensor_model_parallel_size=1"),
    _count("parallel/pp-range", "model.pipeline_model_parallel_size", MAX_PARALLEL, "pipeline parallel size",
           "model.pipeline_model_parallel_size=1"),
    _count("parallel/cp-range", "model.context_parallel_size", MAX_PARALLEL, "context parallel size",
           "model.context_parallel_size=1"),
    _count("parallel/ep-range", "model.expert_model_parallel_size", MAX_PARALLEL, "expert parallel size",
           "model.expert_model_parallel_size=1"),
    _count("parallel/etp-range", "model.expert_tensor_parallel_size", MAX_PARALLEL,
           "expert tensor parallel size; null: the tensor parallel size", "model.expert_tensor_parallel_size=null",
           nullable=True),
    _count("parallel/vpp-range", "model.virtual_pipeline_model_parallel_size", MAX_LAYERS,
           "model chunks per pipeline stage of the interleaved schedule; null: not interleaved",
           "model.virtual_pipeline_model_parallel_size=null", nullable=True),
    _count("parallel/num-layers-range", "model.num_layers", MAX_LAYERS, "transformer layers",
           "model.num_layers=<the model's layer count>"),
    _count("parallel/heads-range", "model.num_attention_heads", MAX_HEADS, "attention heads",
           "model.num_attention_heads=<the model's head count>"),
    _count("parallel/query-groups-range", "model.num_query_groups", MAX_HEADS,
           "key/value head groups; null: one per head", "model.num_query_groups=null", nullable=True),
    _count("parallel/experts-range", "model.num_moe_experts", MAX_EXPERTS, "MoE experts; null: a dense model",
           "model.num_moe_experts=null", nullable=True),
    _count("parallel/hidden-size-range", "model.hidden_size", MAX_WIDTH, "hidden size",
           "model.hidden_size=<the model's hidden size>"),
    _count("parallel/ffn-hidden-size-range", "model.ffn_hidden_size", MAX_WIDTH, "MLP width",
           "model.ffn_hidden_size=<the model's MLP width>", nullable=True),
    _count("parallel/kv-channels-range", "model.kv_channels", MAX_WIDTH, "head dimension; null: hidden/heads",
           "model.kv_channels=null", nullable=True),
    _count("parallel/vocab-size-range", "model.vocab_size", MAX_WIDTH, "vocabulary size",
           "model.vocab_size=<the tokenizer's vocabulary size>", nullable=True),
    _count("parallel/seq-length-range", "model.seq_length", MAX_TOKENS, "tokens per sample",
           "--seq-length 4096"),
    _count("parallel/dataset-seq-length-range", "dataset.seq_length", MAX_TOKENS, "tokens per sample",
           "--seq-length 4096"),
    _count("parallel/global-batch-range", "train.global_batch_size", MAX_TOKENS, "samples per step",
           "train.global_batch_size=<a multiple of micro batch x data parallel size>"),
    _count("parallel/micro-batch-range", "train.micro_batch_size", MAX_TOKENS, "samples per micro batch",
           "train.micro_batch_size=1"),
    _count("parallel/train-iters-range", "train.train_iters", MAX_TOKENS,
           "training steps; null: set by train.train_samples", "train.train_iters=100", nullable=True),
)

# Sizes the planner counts with but no grid rule divides by: out of range, they are refused by key (and the plan
# with them) without silencing the grid rules, so a command still shows every problem at once.
# Megatron Bridge's setup pads the tokenizer's vocabulary to a multiple of this x TP (calculate_padded_vocab_size):
# 0 divides by zero there, after the launch; the planner counts the padded rows
VOCAB_PADDING_MULTIPLE = _count(
    "parallel/vocab-padding-range", "model.make_vocab_size_divisible_by", MAX_WIDTH,
    "the vocabulary is padded to a multiple of it x the tensor parallel size", "model.make_vocab_size_divisible_by=128")

MODEL_COUNT_RANGES: tuple[KeyRange, ...] = (MOE_ROUTER_TOPK, MOE_FFN_HIDDEN_SIZE, RECOMPUTE_NUM_LAYERS,
                                            VOCAB_PADDING_MULTIPLE)


# The numbers a user most often overrides that nothing checks before the launch: Megatron Bridge's validate() and
# Megatron Core's __post_init__ take them as they are (lr=inf, nan, a negative epsilon, a dropout of 1.5), and what
# does check some of them runs after the launch (OptimizerParamScheduler's and the fp16 grad scaler's asserts) or
# never (the run trains garbage: an infinite or NaN loss from the first step, or weights that never move). A value
# of the wrong type is refused by the override layer; NaN and infinity are numbers there, so they are refused here.
# What validate() refuses itself (start_weight_decay >= 0, end >= start, lr_decay_steps > 0, warmup given one way)
# is its rule, not one of these.

def _bounds_text(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f"{'>' if low_open else '>='} {low:g} and {'<' if high_open else '<='} {high:g}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low:g}"
    return f"{'<' if high_open else '<='} {high:g}"


def _in_bounds(value: Any, low: float | None, high: float | None, low_open: bool, high_open: bool) -> bool:
    return ((low is None or (value > low if low_open else value >= low))
            and (high is None or (value < high if high_open else value <= high)))


def _real(id: str, key: str, what: str, fix: str, low: float | None = None, high: float | None = None,
          low_open: bool = False, high_open: bool = False, nullable: bool = False, infinite_ok: bool = False,
          whole: bool = False, each: bool = False) -> KeyRange:
    """A number in bounds: finite (``infinite_ok``: +inf too, where it means a limit turned off), a whole number
    (``whole``), or null (``nullable``: the library's default); ``each``: a list of such numbers is taken too."""

    def one(value: Any) -> bool:
        if whole:
            return is_count(value, int(low) if low is not None else -(1 << 62)) and _in_bounds(
                value, low, high, low_open, high_open)
        ok_number = is_number(value) or (infinite_ok and isinstance(value, float) and value == math.inf)
        return ok_number and _in_bounds(value, low, high, low_open, high_open)

    def holds(cfg: Any) -> bool:
        value = value_at(cfg, key)
        if value is _ABSENT or (nullable and value is None):
            return True
        if each and isinstance(value, (list, tuple)):
            return bool(value) and all(one(v) for v in value)
        return one(value)

    kind = "a whole number" if whole else ("a number" if infinite_ok else "a finite number")
    text = (f"must be {kind} {_bounds_text(low, high, low_open, high_open)}" + (" (or a list of them)" if each else "")
            + (" or null" if nullable else "") + f" ({what})")
    return KeyRange(id=id, key=key, text=text, holds=holds, fix=fixed(fix))


def _lr(cfg: Any) -> Any:
    return value_at(cfg, "optimizer.lr")


def _up_to_lr_holds(key: str) -> Callable[[Any], bool]:
    """0 <= the key <= optimizer.lr (where lr is itself a number: its own range reports it otherwise)."""

    def holds(cfg: Any) -> bool:
        value, lr = value_at(cfg, key), _lr(cfg)
        if value is _ABSENT:
            return True
        return is_number(value) and value >= 0 and (not is_number(lr) or value <= lr)

    return holds


def _up_to_lr_fix(key: str, share: float) -> Callable[[Any], str]:
    def fix(cfg: Any) -> str:
        lr = None if cfg is None else _lr(cfg)
        return f"{key}={lr * share:g}" if is_number(lr) and lr > 0 else f"{key}=0.0"

    return fix


def _with_lr(key: str) -> Callable[[Any], str]:
    return lambda cfg: (f"{show_typed(value_at(cfg, key), number=True)} "
                        f"(optimizer.lr={show_typed(_lr(cfg), number=True)})")


def _weight_decay_set(value: Any) -> bool:
    """Set and not infinite; NaN, a value below 0 and the order of start and end are validate()'s own checks."""
    return value is _ABSENT or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                and not (isinstance(value, float) and math.isinf(value)))


def _weight_decay_meant(cfg: Any, name: str) -> str:
    """The other end of the schedule where it is set (a constant weight decay needs both equal), else
    optimizer.weight_decay, else Megatron Bridge's recipes' 0.033."""
    other = "end_weight_decay" if name == "start_weight_decay" else "start_weight_decay"
    for key in (f"scheduler.{other}", "optimizer.weight_decay"):
        value = None if cfg is None else value_at(cfg, key)
        if is_number(value) and value >= 0:
            return f"{value:g}"
    return "0.033"


HYPERPARAMETER_RANGES: tuple[KeyRange, ...] = (
    # optimizer (Megatron Core's OptimizerConfig: no check of these)
    _real("hyperparameter/lr-range", "optimizer.lr", "the peak learning rate; inf or NaN makes every weight "
          "NaN at the first step, 0 or less never trains", "optimizer.lr=3e-4", low=0, low_open=True),
    KeyRange(id="hyperparameter/min-lr-range", key="optimizer.min_lr",
             text="must be a finite number from 0 to optimizer.lr (the learning rate the decay ends at; Megatron "
                  "Core's scheduler asserts 0 <= min_lr <= lr only once the run has started)",
             holds=_up_to_lr_holds("optimizer.min_lr"), fix=_up_to_lr_fix("optimizer.min_lr", 0.1),
             observed=_with_lr("optimizer.min_lr"), fix_text="optimizer.min_lr=<from 0 to optimizer.lr>"),
    _real("hyperparameter/weight-decay-range", "optimizer.weight_decay", "the weight decay coefficient",
          "optimizer.weight_decay=0.1", low=0),
    _real("hyperparameter/adam-beta1-range", "optimizer.adam_beta1", "Adam's first-moment decay; 1 or more "
          "divides by a bias correction of 0", "optimizer.adam_beta1=0.9", low=0, high=1, high_open=True),
    _real("hyperparameter/adam-beta2-range", "optimizer.adam_beta2", "Adam's second-moment decay; 1 or more "
          "divides by a bias correction of 0", "optimizer.adam_beta2=0.95", low=0, high=1, high_open=True),
    _real("hyperparameter/adam-eps-range", "optimizer.adam_eps", "added to Adam's denominator; 0 or less "
          "divides by zero where a gradient is 0", "optimizer.adam_eps=1e-8", low=0, low_open=True),
    _real("hyperparameter/clip-grad-range", "optimizer.clip_grad", "the gradient norm clipped to; 0 turns "
          "clipping off", "optimizer.clip_grad=1.0", low=0, infinite_ok=True),
    _real("hyperparameter/loss-scale-range", "optimizer.loss_scale", "fp16's static loss scale; null: the "
          "dynamic one", "optimizer.loss_scale=null", low=0, low_open=True, nullable=True),
    _real("hyperparameter/initial-loss-scale-range", "optimizer.initial_loss_scale", "fp16's first dynamic "
          "loss scale", "optimizer.initial_loss_scale=4294967296", low=0, low_open=True),
    _real("hyperparameter/min-loss-scale-range", "optimizer.min_loss_scale", "the smallest dynamic loss scale "
          "of fp16", "optimizer.min_loss_scale=1.0", low=0, low_open=True),
    _real("hyperparameter/loss-scale-window-range", "optimizer.loss_scale_window", "steps without an overflow "
          "before fp16's loss scale grows", "optimizer.loss_scale_window=1000", low=0, low_open=True),
    _real("hyperparameter/hysteresis-range", "optimizer.hysteresis", "overflows tolerated before fp16's loss "
          "scale drops", "optimizer.hysteresis=2", low=1, whole=True),
    # scheduler (what SchedulerConfig.finalize and validate() leave unchecked)
    _real("hyperparameter/warmup-iters-range", "scheduler.lr_warmup_iters", "steps of learning-rate warmup",
          "scheduler.lr_warmup_iters=0", low=0, whole=True),
    _real("hyperparameter/warmup-samples-range", "scheduler.lr_warmup_samples", "samples of learning-rate warmup",
          "scheduler.lr_warmup_samples=0", low=0, whole=True),
    _real("hyperparameter/warmup-fraction-range", "scheduler.lr_warmup_fraction", "the share of the decay "
          "spent warming up", "scheduler.lr_warmup_fraction=0.01", low=0, high=1, nullable=True),
    KeyRange(id="hyperparameter/warmup-init-range", key="scheduler.lr_warmup_init",
             text="must be a finite number from 0 to optimizer.lr (the learning rate warmup starts from; Megatron "
                  "Core's scheduler asserts it is at most lr only once the run has started)",
             holds=_up_to_lr_holds("scheduler.lr_warmup_init"), fix=_up_to_lr_fix("scheduler.lr_warmup_init", 0.0),
             observed=_with_lr("scheduler.lr_warmup_init"), fix_text="scheduler.lr_warmup_init=0.0"),
    *(KeyRange(id=f"hyperparameter/{name.replace('_', '-')}-set", key=f"scheduler.{name}",
               text=f"must be set, and not infinite ({what}; Megatron Core's scheduler fails its first step on "
                    "null, and trains NaN weights from infinity; below 0 or out of order: validate()'s own rules)",
               holds=lambda cfg, name=name: _weight_decay_set(value_at(cfg, f"scheduler.{name}")),
               fix=lambda cfg, name=name: f"scheduler.{name}={_weight_decay_meant(cfg, name)}",
               fix_text=f"scheduler.{name}=<the weight decay meant>")
      for name, what in (("start_weight_decay", "the weight decay the scheduler starts from, which it sets "
                                                "in place of optimizer.weight_decay"),
                         ("end_weight_decay", "the weight decay the scheduler ends at"))),
    # model (TransformerConfig.__post_init__ checks none of these)
    _real("hyperparameter/init-method-std-range", "model.init_method_std", "the standard deviation of the "
          "initial weights", "model.init_method_std=0.02", low=0, low_open=True),
    _real("hyperparameter/hidden-dropout-range", "model.hidden_dropout", "a probability; 1 drops every "
          "activation", "model.hidden_dropout=0.0", low=0, high=1, high_open=True),
    _real("hyperparameter/attention-dropout-range", "model.attention_dropout", "a probability; 1 drops every "
          "attention weight", "model.attention_dropout=0.0", low=0, high=1, high_open=True),
    _real("hyperparameter/layernorm-epsilon-range", "model.layernorm_epsilon", "added to the norm's variance; "
          "0 or less divides by zero", "model.layernorm_epsilon=1e-6", low=0, low_open=True),
    _real("hyperparameter/rotary-base-range", "model.rotary_base",
          "the RoPE base period; Gemma3 gives two, its local and its global layers'",
          "model.rotary_base=1000000", low=0, low_open=True, each=True),
    _real("hyperparameter/rotary-percent-range", "model.rotary_percent", "the share of each head RoPE "
          "rotates", "model.rotary_percent=1.0", low=0, high=1, low_open=True),
    _real("hyperparameter/moe-aux-loss-coeff-range", "model.moe_aux_loss_coeff", "the load-balancing loss "
          "weight; 0 turns it off", "model.moe_aux_loss_coeff=0.001", low=0, each=True),
    _real("hyperparameter/moe-z-loss-coeff-range", "model.moe_z_loss_coeff", "the router's z-loss weight",
          "model.moe_z_loss_coeff=null", low=0, nullable=True),
    # evaluation (an interval of 0 or null turns it off)
    _real("hyperparameter/eval-interval-range", "validation.eval_interval", "steps between evaluations; 0 "
          "or null: none", "validation.eval_interval=null", low=0, whole=True, nullable=True),
    _real("hyperparameter/eval-iters-range", "validation.eval_iters", "batches each evaluation runs",
          "validation.eval_iters=0", low=0, whole=True, nullable=True),
    _real("hyperparameter/train-eval-interval-range", "train.eval_interval", "steps between evaluations "
          "(deprecated here: validation.eval_interval); 0 or null: none", "train.eval_interval=null", low=0,
          whole=True, nullable=True),
    _real("hyperparameter/train-eval-iters-range", "train.eval_iters", "batches each evaluation runs "
          "(deprecated here: validation.eval_iters)", "train.eval_iters=null", low=0, whole=True, nullable=True),
    # Megatron Bridge asserts a positive seed at the launch (initialize._set_random_seed) and adds 100 per pipeline
    # stage and 10 per data-parallel rank before numpy's seed, which takes at most 2**32 - 1
    _real("hyperparameter/seed-range", "rng.seed", "the random seed: Megatron Bridge asserts it is positive, and "
          "numpy's seed takes at most 2**32 - 1 after 100 per pipeline stage and 10 per data-parallel rank are "
          "added", "rng.seed=1234", low=1, high=2**31 - 1, whole=True),
)

KEY_RANGES: tuple[KeyRange, ...] = (
    OPTIMIZER_OFFLOAD_FRACTION, CPU_OFFLOADING_NUM_LAYERS, OFFLOAD_MODULES_KNOWN,
    ACTIVATION_OFFLOAD_FRACTION, MIN_OFFLOADED_TENSOR_SIZE, DELTA_OFFLOAD_BYTES_ACROSS_PP_RANKS, *GRID_RANGES,
    *MODEL_COUNT_RANGES, *HYPERPARAMETER_RANGES,
)


def grid_sane(cfg: Any) -> bool:
    """Every size of the parallel grid, batch and model shape is in its range: the rules and the planner
    that divide by them may run (the ranges report what is not)."""
    try:
        return all(key_range.holds(cfg) for key_range in GRID_RANGES)
    except Exception:
        return False


def range_violations(cfg: Any, keys: Iterable[str]) -> list[tuple[KeyRange, str, str]]:
    """The ranges of ``keys`` that ``cfg`` breaks: (range, value shown, fix)."""
    keys = set(keys)
    return [(key_range, key_range.value(cfg), key_range.fix(cfg)) for key_range in KEY_RANGES
            if key_range.key in keys and not key_range.holds(cfg)]
