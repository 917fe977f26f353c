"""The training hyperparameters: each number's range (facts/key_ranges.py's HYPERPARAMETER_RANGES: what neither
Megatron Bridge's validate() nor Megatron Core's __post_init__ checks before the launch), and the scheduler's
settings that take a value given on the command line out of the run without a word (and recompute_modules,
which Megatron Core reads only with selective recompute): a value replaced by another
(max_steps over lr_decay_iters, the scheduler's weight decay over optimizer.weight_decay, a warmup capped below the
decay) or ignored (a WSD setting without WSD, the end of a decay with a constant learning rate). Only a key the
command line gave (Context.given_keys) is reported there: a recipe's own settings are the recipe's choice."""

from __future__ import annotations

from typing import Any

from mbridge_offload.facts.config_tree import show
from mbridge_offload.facts.key_ranges import HYPERPARAMETER_RANGES, is_number
from mbridge_offload.validation.guard import guarded
from mbridge_offload.validation.rule import HYPERPARAMETERS, Context, Rule
from mbridge_offload.validation.upstream_rules import _decay_steps as decay_steps


def _s(c: Context) -> Any:
    return c.cfg.scheduler


def _sample_based(c: Context) -> bool:
    return c.cfg.train.train_samples is not None


def _decay_steps(c: Context) -> float | None:
    """scheduler.lr_decay_steps as validate() computes it; None where the numbers it reads are out of their ranges
    (their own rules report them)."""
    try:
        steps = decay_steps(c)
    except TypeError:
        return None
    return steps if is_number(steps) and steps > 0 else None


def _warmup_steps(c: Context) -> float | None:
    s = _s(c)
    decay = _decay_steps(c)
    if s.lr_warmup_fraction is not None:
        return s.lr_warmup_fraction * decay if decay is not None and is_number(s.lr_warmup_fraction) else None
    if _sample_based(c):
        return s.lr_warmup_samples if is_number(s.lr_warmup_samples) else None
    gbs = c.cfg.train.global_batch_size
    return s.lr_warmup_iters * gbs if is_number(s.lr_warmup_iters) and is_number(gbs) else None


_WARMUP_KEYS = ("scheduler.lr_warmup_iters", "scheduler.lr_warmup_samples", "scheduler.lr_warmup_fraction")


def _warmup_given(c: Context) -> list[str]:
    """The warmup keys the command line gave a warmup with (lr_warmup_iters=0 given asks for none)."""
    return [key for key in _WARMUP_KEYS if c.given(key) and c.get(key) not in (None, 0)]


def _warmup_capped(c: Context) -> bool:
    warmup, decay = _warmup_steps(c), _decay_steps(c)
    return warmup is not None and decay is not None and warmup >= decay


def _warmup_fix(c: Context) -> str:
    decay = _decay_steps(c)
    if decay is None:
        return "scheduler.lr_warmup_iters=<fewer steps than the decay>"
    if c.given("scheduler.lr_warmup_fraction"):
        return "scheduler.lr_warmup_fraction=0.1  (below 1: a share of the decay)"
    if _sample_based(c):
        return f"scheduler.lr_warmup_samples={max(0, int(decay) - 1)}  (or fewer)"
    gbs = c.cfg.train.global_batch_size
    return f"scheduler.lr_warmup_iters={max(0, int(decay // gbs) - 1)}  (or fewer; or a longer train.train_iters)"


def _wd_given_alone(c: Context) -> bool:
    return (c.given("optimizer.weight_decay") and not c.given("scheduler.start_weight_decay")
            and not c.given("scheduler.end_weight_decay") and is_number(_s(c).start_weight_decay)
            and is_number(_s(c).end_weight_decay))


_WSD_KEYS = ("scheduler.lr_wsd_decay_iters", "scheduler.lr_wsd_decay_samples", "scheduler.lr_wsd_decay_style")
# what a constant learning rate never reads: get_lr returns optimizer.lr after the warmup
_DECAY_KEYS = ("optimizer.min_lr", "scheduler.lr_decay_iters", "scheduler.lr_decay_samples", "scheduler.max_steps")


def _given_of(c: Context, keys: tuple[str, ...]) -> list[str]:
    return [key for key in keys if c.given(key)]


def _shown_given(c: Context, keys: list[str]) -> str:
    return ", ".join(f"{key}={show(c.get(key))}" for key in keys)


RULES: tuple[Rule, ...] = guarded(
    *(Rule.of_range(HYPERPARAMETERS, key_range) for key_range in HYPERPARAMETER_RANGES),
    # OptimizerParamScheduler.get_wd asserts start == end for the constant style at its first step, after the launch
    Rule(id="scheduler/constant-weight-decay-equal", mechanism=HYPERPARAMETERS, key="scheduler.end_weight_decay",
         text="with scheduler.weight_decay_incr_style=constant, start_weight_decay and end_weight_decay must be "
              "equal (Megatron Core's scheduler asserts it at its first step, after the launch)",
         applies=lambda c: (_s(c).weight_decay_incr_style == "constant" and is_number(_s(c).start_weight_decay)
                            and is_number(_s(c).end_weight_decay)),
         holds=lambda c: _s(c).start_weight_decay == _s(c).end_weight_decay,
         fix=lambda c: (f"scheduler.end_weight_decay={show(_s(c).start_weight_decay)}  (or "
                        "scheduler.weight_decay_incr_style=linear to move from one to the other)"),
         observed=lambda c: (f"{show(_s(c).end_weight_decay)} (start_weight_decay="
                             f"{show(_s(c).start_weight_decay)}, weight_decay_incr_style=constant)"),
         fix_text="scheduler.end_weight_decay=<start_weight_decay>  (or weight_decay_incr_style=linear)"),
    # the scheduler sets every parameter group's weight decay at each step, from its own start/end values
    Rule(id="scheduler/weight-decay-replaces-given", mechanism=HYPERPARAMETERS, key="optimizer.weight_decay",
         text="optimizer.weight_decay given on the command line does not train: the learning-rate scheduler sets "
              "the weight decay at every step from scheduler.start_weight_decay / end_weight_decay",
         applies=_wd_given_alone,
         holds=lambda c: _s(c).start_weight_decay == _s(c).end_weight_decay == c.opt.weight_decay,
         fix=lambda c: (f"scheduler.start_weight_decay={show(c.opt.weight_decay)} "
                        f"scheduler.end_weight_decay={show(c.opt.weight_decay)}"),
         observed=lambda c: (f"{show(c.opt.weight_decay)} given (the scheduler trains "
                             f"{show(_s(c).start_weight_decay)} to {show(_s(c).end_weight_decay)})"),
         fix_text="scheduler.start_weight_decay=<the value> scheduler.end_weight_decay=<the value>"),
    # validate()'s _calculate_scheduler_steps: lr_decay_iters = max_steps whenever max_steps is set
    Rule(id="scheduler/max-steps-replaces-decay-iters", mechanism=HYPERPARAMETERS, key="scheduler.lr_decay_iters",
         text="scheduler.lr_decay_iters given on the command line is replaced by scheduler.max_steps (with max_steps "
              "set, Megatron Bridge decays the learning rate over max_steps, with no message)",
         applies=lambda c: (c.given("scheduler.lr_decay_iters") and _s(c).max_steps is not None
                            and not _sample_based(c)),
         holds=lambda c: _s(c).lr_decay_iters == _s(c).max_steps,
         fix=lambda c: (f"scheduler.max_steps=null  (the decay then spans lr_decay_iters="
                        f"{show(_s(c).lr_decay_iters)}), or scheduler.max_steps={show(_s(c).lr_decay_iters)}"),
         observed=lambda c: f"{show(_s(c).lr_decay_iters)} given (max_steps={show(_s(c).max_steps)} trains)",
         fix_text="scheduler.max_steps=null  (or max_steps=<the decay meant>)"),
    # validate()'s _calculate_scheduler_steps caps lr_warmup_steps to lr_decay_steps - 1 with a Python warning
    Rule(id="scheduler/warmup-capped", mechanism=HYPERPARAMETERS, key="scheduler.lr_warmup_iters",
         text="a warmup given on the command line (lr_warmup_iters, lr_warmup_samples or lr_warmup_fraction) as "
              "long as the decay or longer is cut to one step less than the decay by Megatron Bridge (a Python "
              "warning in the log): the run warms up for another length than the one given",
         applies=lambda c: bool(_warmup_given(c)), holds=lambda c: not _warmup_capped(c), fix=_warmup_fix,
         observed=lambda c: (f"lr_warmup_steps {show(_warmup_steps(c))} >= lr_decay_steps {show(_decay_steps(c))} "
                             f"(samples; given: {_shown_given(c, _warmup_given(c))}); trained: "
                             f"{show(_decay_steps(c) - 1)}"),
         fix_text="scheduler.lr_warmup_iters=<fewer steps than the decay>"),
    Rule(id="scheduler/wsd-given-without-wsd", mechanism=HYPERPARAMETERS, key="scheduler.lr_decay_style",
         text="a WSD setting given on the command line (lr_wsd_decay_iters, lr_wsd_decay_samples, "
              "lr_wsd_decay_style) is ignored unless scheduler.lr_decay_style=WSD",
         applies=lambda c: bool(_given_of(c, _WSD_KEYS)), holds=lambda c: _s(c).lr_decay_style == "WSD",
         fix=lambda c: ("scheduler.lr_decay_style=WSD  (or drop " + " ".join(_given_of(c, _WSD_KEYS)) + ")"),
         observed=lambda c: f"{_s(c).lr_decay_style} (given: {_shown_given(c, _given_of(c, _WSD_KEYS))})",
         fix_text="scheduler.lr_decay_style=WSD  (or drop the WSD keys)", severity="warning"),
    Rule(id="scheduler/constant-lr-ignores-given", mechanism=HYPERPARAMETERS, key="scheduler.lr_decay_style",
         text="with scheduler.lr_decay_style=constant the learning rate stays optimizer.lr after the warmup: "
              "optimizer.min_lr, lr_decay_iters / lr_decay_samples and max_steps given on the command line are "
              "ignored for it",
         applies=lambda c: bool(_given_of(c, _DECAY_KEYS)), holds=lambda c: _s(c).lr_decay_style != "constant",
         fix=lambda c: ("scheduler.lr_decay_style=cosine  (or drop " + " ".join(_given_of(c, _DECAY_KEYS)) + ")"),
         observed=lambda c: f"constant (given: {_shown_given(c, _given_of(c, _DECAY_KEYS))})",
         fix_text="scheduler.lr_decay_style=cosine  (or drop the decay keys)", severity="warning"),
    # Megatron Core reads recompute_modules only where recompute_granularity is selective (transformer_layer.py,
    # attention.py, moe_layer.py), so without it the list recomputes nothing and no check reads its names
    Rule(id="recompute/modules-given-without-selective", mechanism=HYPERPARAMETERS, key="model.recompute_modules",
         text="model.recompute_modules given on the command line is ignored unless "
              "model.recompute_granularity=selective: nothing is recomputed and its names are not checked",
         applies=lambda c: c.given("model.recompute_modules"),
         holds=lambda c: c.cfg.model.recompute_granularity == "selective",
         fix=lambda c: "model.recompute_granularity=selective  (or drop model.recompute_modules)",
         observed=lambda c: (f"{show(c.cfg.model.recompute_modules)} (recompute_granularity="
                             f"{show(c.cfg.model.recompute_granularity)})"),
         fix_text="model.recompute_granularity=selective  (or drop model.recompute_modules)", severity="warning"),
)


