"""Rules of deterministic mode: everything bit-reproducible training needs, reported together (upstream's
validate() asserts them one at a time, and the environment ones without a key)."""

from __future__ import annotations

from mbridge_offload.facts.config_tree import show
from mbridge_offload.facts.determinism import CUBLAS_WORKSPACE_CHOICES, DETERMINISTIC_ENV, NCCL_ALGO_CHOICES
from mbridge_offload.facts.key_ranges import fixed
from mbridge_offload.validation.guard import guarded
from mbridge_offload.validation.rule import DETERMINISM, Context, Rule


def deterministic_mode_on(ctx: Context) -> bool:
    return bool(getattr(ctx.model, "deterministic_mode", False))


def _env_rule(name: str, choices: tuple[str, ...], why: str) -> Rule:
    """An environment variable deterministic mode needs: named as such, with the shell winning over env_vars."""
    return Rule(id=f"deterministic/{name.lower().replace('_', '-')}", mechanism=DETERMINISM, key=f"env_vars.{name}",
                text=f"deterministic mode needs the environment variable {name} set to "
                     + (" or ".join(choices)) + f": {why}",
                applies=deterministic_mode_on, holds=lambda c: c.env(name) in choices,
                fix=fixed(f"++env_vars.{name}={DETERMINISTIC_ENV[name]}  (or export {name}={DETERMINISTIC_ENV[name]}; "
                          "run_recipe.py --deterministic sets all of it)"),
                observed=lambda c: f"{show(c.env(name))} (environment variable)")


RULES: tuple[Rule, ...] = guarded(
    Rule(id="deterministic/cross-entropy-fusion", mechanism=DETERMINISM, key="model.cross_entropy_loss_fusion",
         text="deterministic mode needs the unfused cross entropy (the fused kernel is not deterministic)",
         applies=deterministic_mode_on, holds=lambda c: not getattr(c.model, "cross_entropy_loss_fusion", False),
         fix=fixed("model.cross_entropy_loss_fusion=False")),
    _env_rule("NCCL_ALGO", NCCL_ALGO_CHOICES, "Megatron Bridge asserts it, and other NCCL algorithms reduce in "
              "varying order"),
    _env_rule("NVTE_ALLOW_NONDETERMINISTIC_ALGO", ("0",), "else Transformer Engine may pick non-deterministic "
              "attention kernels"),
    _env_rule("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CHOICES, "deterministic mode turns on "
              "torch.use_deterministic_algorithms, which then refuses cuBLAS without it"),
)
