"""Which memory the planner counts the loss's block against: the caching allocator's gap beside the peak that is at
most the loss's largest tensor (docs/benchmarks/reserve-snapshot/).

One environment variable selects it, like the offload engine, so that ``plan_offload.py``, ``run_recipe.py -of auto``
and ``check_auto.py`` (whose runs inherit the shell) plan with the same rule; the shell wins over ``env_vars``.
"""

from __future__ import annotations

from typing import Mapping

from mbridge_offload.facts.environment import run_env

RESERVE_RULE_ENV = "MBRIDGE_OFFLOAD_RESERVE_RULE"
RESERVE_RULE_KEY = f"env_vars.{RESERVE_RULE_ENV}"
STEADY_PEAK = "steady-peak"
FIRST_STEP = "first-step"
DEFAULT_RESERVE_RULE = FIRST_STEP
# rule: what it counts, in the words of the plan's notes
RESERVE_RULES = {
    FIRST_STEP: "the loss's block beside step 1's memory before the Adam moments of the GPU part exist, when the "
                "communicators are made, and the small envelope beside the steady peak, since PyTorch takes a later "
                "block back on a full device (docs/benchmarks/reserve-snapshot/); for dense models, one pipeline "
                "stage and the engines that run Adam on the GPU part (not stream). auto trained at its fraction with "
                "it on 5 of 5 new configurations (docs/benchmarks/planner-auto-5/)",
    STEADY_PEAK: "the loss's block beside the steady state's peak, as if a block the allocator keeps after step 1 "
                 "were lost to the run: more than first-step where the GPU part keeps Adam moments; auto never ran "
                 "out of memory with it either (docs/benchmarks/planner-auto-4/)",
}


def reserve_rule(env_vars: Mapping[str, object] | None, environ: Mapping[str, str]) -> str:
    """The rule a plan uses: the shell's MBRIDGE_OFFLOAD_RESERVE_RULE, else the config's, else the default. Unknown
    values come back as given (the validator names them)."""
    value = run_env(RESERVE_RULE_ENV, env_vars, environ)
    return DEFAULT_RESERVE_RULE if value is None else value.strip()
