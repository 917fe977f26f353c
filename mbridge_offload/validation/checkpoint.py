"""Rules of resuming: what the checkpoint in ``checkpoint.load`` was saved with must allow this config to
load it. Read from the checkpoint's run_config.yaml before anything is launched.

What works (with the resume fix of mbridge_offload/runtime/resume_fix.py): resuming with optimizer offload at
the fraction it was saved with. At another fraction the state loads equal (the distributed optimizer saves each
parameter's state whatever device stepped it; CPU-tested), but a parameter that changes sides is then stepped
by the other Adam, which rounds differently: no longer bit-exact, so refused. What does not load: turning
optimizer offload on for a checkpoint saved without it
(the hybrid optimizer expects a master copy that checkpoint lacks), or changing the precision-aware optimizer
between save and resume (different state layouts)."""

from __future__ import annotations

from mbridge_offload.facts.checkpoint_dir import latest_iteration_dir
from mbridge_offload.facts.key_ranges import fixed, is_number
from mbridge_offload.validation.guard import guarded
from mbridge_offload.validation.rule import CHECKPOINT, Context, Rule


def _saved_optimizer(ctx: Context) -> dict:
    optimizer = (ctx.saved_checkpoint_config or {}).get("optimizer")
    return optimizer if isinstance(optimizer, dict) else {}


def _loads_optimizer(ctx: Context) -> bool:
    ckpt = ctx.cfg.checkpoint
    return bool(getattr(ckpt, "load", None)) and getattr(ckpt, "load_optim", True) and \
        not getattr(ckpt, "finetune", False) and bool(_saved_optimizer(ctx))


def _saved(ctx: Context, name: str):
    return _saved_optimizer(ctx).get(name)


def _effective_fraction(offload, fraction) -> float:
    return float(fraction) if offload and is_number(fraction) else 0.0


def _fraction_now(ctx: Context) -> float:
    return _effective_fraction(ctx.opt.optimizer_cpu_offload, ctx.opt.optimizer_offload_fraction)


def _fraction_saved(ctx: Context) -> float:
    return _effective_fraction(_saved(ctx, "optimizer_cpu_offload"), _saved(ctx, "optimizer_offload_fraction"))


RULES: tuple[Rule, ...] = guarded(
    Rule(id="checkpoint/offload-turned-on", mechanism=CHECKPOINT, key="optimizer.optimizer_cpu_offload",
         text="a checkpoint saved without optimizer offload cannot be resumed with it (the hybrid optimizer "
              "needs a master copy of each parameter that such a checkpoint lacks)",
         applies=lambda c: _loads_optimizer(c) and bool(c.opt.optimizer_cpu_offload),
         holds=lambda c: bool(_saved(c, "optimizer_cpu_offload")),
         fix=fixed("optimizer.optimizer_cpu_offload=False  (resume as saved; or load only the weights: "
                   "checkpoint.load_optim=False)"),
         observed=lambda c: (f"True (the checkpoint in {latest_iteration_dir(c.cfg.checkpoint.load)} was saved with "
                             "optimizer.optimizer_cpu_offload=False)")),
    Rule(id="checkpoint/fraction-changed", mechanism=CHECKPOINT, key="optimizer.optimizer_offload_fraction",
         text="resume with the optimizer offload fraction the checkpoint was saved with: at another fraction the "
              "state loads equal, but parameters that move between the CPU and the GPU Adam continue with other "
              "rounding, so the run no longer continues the saved one exactly",
         applies=lambda c: (_loads_optimizer(c) and "optimizer_offload_fraction" in _saved_optimizer(c)
                            and not (c.opt.optimizer_cpu_offload and not _saved(c, "optimizer_cpu_offload"))),
         holds=lambda c: _fraction_now(c) == _fraction_saved(c),
         fix=lambda c: (f"optimizer.optimizer_offload_fraction={_fraction_saved(c):g}" if _fraction_saved(c)
                        else "optimizer.optimizer_cpu_offload=False"),
         observed=lambda c: f"{_fraction_now(c):g} (saved with {_fraction_saved(c):g})",
         fix_text="optimizer.optimizer_offload_fraction=<the checkpoint's>"),
    Rule(id="checkpoint/precision-aware-changed", mechanism=CHECKPOINT, key="optimizer.use_precision_aware_optimizer",
         text="the precision-aware optimizer must be as it was when the checkpoint was saved (its optimizer "
              "states are laid out differently)",
         applies=lambda c: _loads_optimizer(c) and _saved(c, "use_precision_aware_optimizer") is not None,
         holds=lambda c: bool(_saved(c, "use_precision_aware_optimizer")) == bool(c.opt.use_precision_aware_optimizer),
         fix=lambda c: f"optimizer.use_precision_aware_optimizer={bool(_saved(c, 'use_precision_aware_optimizer'))}",
         fix_text="optimizer.use_precision_aware_optimizer=<the checkpoint's>",
         observed=lambda c: (f"{c.opt.use_precision_aware_optimizer} (saved with "
                             f"{bool(_saved(c, 'use_precision_aware_optimizer'))})")),
)
