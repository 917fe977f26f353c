"""Rules of optimizer offload (Megatron Core's HybridDeviceOptimizer inside the distributed optimizer)."""

from __future__ import annotations

from typing import Any

from mbridge_offload.facts.dtypes import dtype_bytes  # the planner's bytes per element: one notion of "below fp32"
from mbridge_offload.facts.key_ranges import OPTIMIZER_OFFLOAD_FRACTION, fixed, is_number
from mbridge_offload.validation.choices import OPTIMIZER_WORDS
from mbridge_offload.validation.guard import guarded
from mbridge_offload.validation.rule import OPTIMIZER, Context, Rule

PRECISION_AWARE_DTYPES = ("exp_avg_dtype", "exp_avg_sq_dtype", "main_params_dtype")


def optimizer_offload_on(ctx: Context) -> bool:
    return bool(ctx.opt.optimizer_cpu_offload)


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _lower_precision_states(ctx: Context) -> bool:
    return any(dtype_bytes(getattr(ctx.opt, name)) < 4 for name in PRECISION_AWARE_DTYPES)


def _fraction(ctx: Context) -> float | None:
    """The offload fraction when it is a number (its range rule reports anything else)."""
    value = ctx.opt.optimizer_offload_fraction
    return value if is_number(value) else None


# The fraction a fix names where one is needed and the user has not chosen: half, the planner's middle
SUGGESTED_FRACTION = 0.5
OFFLOAD_ON = "optimizer.optimizer_cpu_offload=True"
DISTRIBUTED_OPTIMIZER_ON = "optimizer.use_distributed_optimizer=True ddp.use_distributed_optimizer=True"
OFFLOAD_ON_TEXT = (f"{OFFLOAD_ON} [optimizer.optimizer_offload_fraction={SUGGESTED_FRACTION} where it offloads "
                   f"nothing] [{DISTRIBUTED_OPTIMIZER_ON} where it is off]")


def _distributed(ctx: Context) -> bool:
    return bool(ctx.opt.use_distributed_optimizer or ctx.cfg.ddp.use_distributed_optimizer)


def offload_on_fix(ctx: Context | None) -> str:
    """The overrides that turn optimizer offload on, with what it needs that the config lacks: a fraction where the
    config's offloads nothing or is out of range, and the distributed optimizer, so that pasting the fix does not lead
    to those rules next (``ctx`` None: the docs table's form)."""
    if ctx is None:
        return OFFLOAD_ON_TEXT
    fraction = _fraction(ctx)
    words = [OFFLOAD_ON]
    if fraction is None or not 0.0 < fraction <= 1.0:
        words.append(f"optimizer.optimizer_offload_fraction={SUGGESTED_FRACTION}")
    if not _distributed(ctx):
        words.append(DISTRIBUTED_OPTIMIZER_ON)
    return " ".join(words)


RULES: tuple[Rule, ...] = guarded(
    Rule.of_range(OPTIMIZER, OPTIMIZER_OFFLOAD_FRACTION),
    Rule(id="optimizer-offload/distributed-optimizer", mechanism=OPTIMIZER, key="optimizer.use_distributed_optimizer",
         text="optimizer offload needs the distributed optimizer (HybridDeviceOptimizer works on its shard)",
         applies=optimizer_offload_on,
         holds=_distributed, fix=fixed(DISTRIBUTED_OPTIMIZER_ON)),
    Rule(id="optimizer-offload/optimizer-kind", mechanism=OPTIMIZER, key="optimizer.optimizer",
         text="optimizer offload supports only 'adam' and 'sgd' (CPU twins exist for these two)",
         # only a word Megatron Core knows: any other is refused once, by choices/optimizer with its did-you-mean
         applies=lambda c: optimizer_offload_on(c) and OPTIMIZER_WORDS.admits(c.opt.optimizer),
         holds=lambda c: c.opt.optimizer in ("adam", "sgd"), fix=fixed("optimizer.optimizer=adam")),
    Rule(id="optimizer-offload/decoupled-weight-decay", mechanism=OPTIMIZER, key="optimizer.decoupled_weight_decay",
         text="optimizer offload supports AdamW-style decoupled weight decay only",
         applies=optimizer_offload_on, holds=lambda c: bool(c.opt.decoupled_weight_decay),
         fix=fixed("optimizer.decoupled_weight_decay=True")),
    Rule(id="optimizer-offload/fraction-zero", mechanism=OPTIMIZER, key="optimizer.optimizer_offload_fraction",
         text="with optimizer offload on and fraction 0 nothing is offloaded, yet the hybrid optimizer runs",
         applies=lambda c: optimizer_offload_on(c) and _fraction(c) is not None, holds=lambda c: _fraction(c) > 0.0,
         fix=fixed(f"optimizer.optimizer_offload_fraction={SUGGESTED_FRACTION}  "
                   "(or optimizer.optimizer_cpu_offload=False)"),
         severity="warning"),
    Rule(id="optimizer-offload/fraction-ignored", mechanism=OPTIMIZER, key="optimizer.optimizer_cpu_offload",
         text="optimizer_offload_fraction > 0 has no effect while optimizer_cpu_offload is False",
         applies=lambda c: not optimizer_offload_on(c) and (_fraction(c) or 0.0) > 0.0,
         holds=lambda c: False,
         fix=lambda c: f"{offload_on_fix(c)}  (or optimizer.optimizer_offload_fraction=0)",
         fix_text=f"{OFFLOAD_ON_TEXT}  (or optimizer.optimizer_offload_fraction=0)",
         severity="warning"),
    Rule(id="optimizer-offload/overlap-ignored", mechanism=OPTIMIZER, key="optimizer.overlap_cpu_optimizer_d2h_h2d",
         text="D2H/H2D overlap has no effect while optimizer_cpu_offload is False",
         applies=lambda c: not optimizer_offload_on(c) and bool(c.opt.overlap_cpu_optimizer_d2h_h2d),
         holds=lambda c: False,
         fix=lambda c: f"{offload_on_fix(c)}  (or optimizer.overlap_cpu_optimizer_d2h_h2d=False)",
         fix_text=f"{OFFLOAD_ON_TEXT}  (or optimizer.overlap_cpu_optimizer_d2h_h2d=False)",
         severity="warning"),
    Rule(id="optimizer-offload/precision-aware-ignored", mechanism=OPTIMIZER,
         key="optimizer.use_precision_aware_optimizer",
         text="with optimizer offload, lower-precision Adam states and master parameters are not used: Megatron Core "
              "builds HybridDeviceOptimizer without exp_avg_dtype / exp_avg_sq_dtype / main_params_dtype (torch AdamW "
              "on the CPU, fused Adam on the GPU, fp32 updates), so they save no memory; the planner counts fp32",
         applies=lambda c: optimizer_offload_on(c) and bool(c.opt.use_precision_aware_optimizer),
         holds=lambda c: not _lower_precision_states(c),
         fix=fixed("optimizer.exp_avg_dtype=float32 optimizer.exp_avg_sq_dtype=float32 "
                   "optimizer.main_params_dtype=float32  "
                   "(or optimizer.optimizer_cpu_offload=False to keep the lower-precision states on the GPU)"),
         observed=lambda c: ", ".join(f"{name}={_dtype_name(getattr(c.opt, name))}" for name in PRECISION_AWARE_DTYPES),
         severity="warning"),
)
