"""What a rule is (``Rule``) and what it reads (``Context``), and the mechanism names shown to users.

A rule names the dotted key it is about, states the rule in words, and computes a fix the user can
paste as an override. Rules only read attributes of a config: nothing here imports anything heavy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Mapping

from mbridge_offload.facts.checkpoint_dir import saved_run_config
from mbridge_offload.facts.config_tree import get_path, show
from mbridge_offload.facts.environment import run_env
from mbridge_offload.facts.key_ranges import KeyRange, show_typed
from mbridge_offload.facts.parallel import ParallelSizes
from mbridge_offload.validation.installed import cuda_available, module_available, te_version

# Mechanism names, as shown to users (the README's offload table groups by these, in this order).
OPTIMIZER = "optimizer offload"
ACTIVATION = "activation offload (layer-level)"
FINE_GRAINED = "fine-grained activation offload"
PARALLELISM = "parallelism"
ENVIRONMENT = "environment"
DETERMINISM = "deterministic mode"
CHECKPOINT = "checkpoint resume"
CHOICES = "fixed-word settings"  # keys typed plain str upstream that take one of a few words (choices.py)
HYPERPARAMETERS = "training hyperparameters"  # numbers nothing upstream checks before the launch, values given unused
RUNTIME = "runtime failure (diagnose only)"  # rules read from a run's log by diagnose.py, never from a config
MECHANISMS = (OPTIMIZER, ACTIVATION, FINE_GRAINED, PARALLELISM, ENVIRONMENT, DETERMINISM, CHECKPOINT, CHOICES,
              HYPERPARAMETERS, RUNTIME)


@dataclass
class Context:
    """What rules read: the config, the GPU count it is validated for, the process environment, and the keys the
    command line gave a value (``given_keys``, as ``overrides.grammar.given_keys`` reads them): a value given equal to
    its default is told from one nobody set only by them. Empty for a config composed in Python: rules then judge
    the values alone."""

    cfg: Any
    num_gpus: int
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    has_module: Callable[[str], bool] = module_available
    te_version: str | None = "detect"  # "detect": look at what is installed; None: not installed
    given_keys: frozenset[str] = frozenset()
    has_cuda: Callable[[], bool] = cuda_available  # a CUDA device here (checks of the GPU's architecture need one)

    def get(self, key: str) -> Any:
        return get_path(self.cfg, key)

    def given(self, key: str) -> bool:
        """Whether the command line gave ``key`` (a dotted key) a value."""
        return key in self.given_keys

    @property
    def model(self) -> Any:
        return self.cfg.model

    @property
    def opt(self) -> Any:
        return self.cfg.optimizer

    @property
    def sizes(self) -> ParallelSizes:
        return ParallelSizes.of(self.model, self.num_gpus)

    @property
    def model_parallel(self) -> int:
        return self.sizes.model_parallel

    @property
    def dp(self) -> int | None:
        """Data-parallel size, or None when the GPU count does not split into the model grid."""
        return self.sizes.dp

    @property
    def num_experts(self) -> int:
        return self.model.num_moe_experts or 0

    def env(self, name: str) -> str | None:
        """The value a launched run will see: the shell wins over the recipe's ``env_vars``."""
        return run_env(name, self.cfg.env_vars, self.environ)

    @cached_property
    def saved_checkpoint_config(self) -> dict[str, Any] | None:
        """The run configuration saved with the newest checkpoint in ``checkpoint.load``, read once per
        validation (the resume rules ask it several times); None when there is nothing to load."""
        return saved_run_config(getattr(self.cfg.checkpoint, "load", None))

    @cached_property
    def installed_te(self) -> str | None:
        return te_version() if self.te_version == "detect" else self.te_version


@dataclass(frozen=True)
class Rule:
    """One constraint. ``holds`` is only asked when ``applies`` is true."""

    id: str
    mechanism: str
    key: str
    text: str
    applies: Callable[[Context], bool]
    holds: Callable[[Context], bool]
    fix: Callable[[Context], str]  # a constant fix ignores the context (the docs table passes None)
    severity: str = "error"  # "error" blocks a launch, "warning" is reported only
    observed: Callable[[Context], str] | None = None  # the value to show, when not the key's own
    fix_text: str = ""  # the fix in the docs table, where ``fix`` depends on the config
    log_signatures: tuple[str, ...] = ()  # regexes of log lines that show this rule broken (diagnose.py)
    # regexes that, on a line near a signature's match, say the line shows another cause (runtime_failures.py)
    log_not_near: tuple[str, ...] = ()

    @classmethod
    def of_range(cls, mechanism: str, key_range: KeyRange) -> "Rule":
        """A key's admissible values (defined once, in facts) as a rule of the table."""
        return cls(id=key_range.id, mechanism=mechanism, key=key_range.key, text=key_range.text,
                   applies=always, holds=lambda ctx: key_range.holds(ctx.cfg),
                   fix=lambda ctx: key_range.fix(None if ctx is None else ctx.cfg),
                   observed=lambda ctx: key_range.value(ctx.cfg),
                   fix_text=key_range.fix_text)

    def value(self, ctx: Context) -> str:
        if self.observed is not None:
            return self.observed(ctx)
        return show_typed(ctx.get(self.key))


def always(ctx: Context) -> bool:
    return True
