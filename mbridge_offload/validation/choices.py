"""Keys that take one of a fixed set of words but are typed plain ``str`` in Megatron Core / Megatron Bridge, so
neither the override layer (which refuses a word outside a ``Literal`` or an enum) nor upstream ``validate()``
checks them: a typo there fails only after launch (``optimizer.optimizer=foo``: when the optimizer is built), or
silently does something else (``model.moe_router_load_balancing_type=aux_los``: the router routes with no
load balancing at all).

The words are the installed libraries' own (Megatron Core 0.19.2, Megatron Bridge 0.6.2), each cited where its
code takes them; tests/validation/test_choices.py reads them back from the installed code, so an upgrade that
changes a set fails there instead of drifting. They are written out here, not imported, because the rule table
runs without Megatron (``run_recipe.py --rules``, the cached fast path of mbridge_offload/fast_check).

Keys already checked elsewhere are not repeated here: ``model.recompute_granularity`` / ``recompute_method`` /
``recompute_modules`` / ``cuda_graph_impl`` (upstream_model_rules.py), ``model.offload_modules``
(facts/key_ranges.py), ``mixed_precision`` (upstream_model_rules.py); keys typed as a ``Literal`` or an enum
(``model.attention_backend``, ``transformer_impl``, ``position_embedding_type``, ``fp8_recipe``, ``fp4``,
``moe_token_dispatcher_type``, ``moe_router_score_function``, ``scheduler.lr_decay_style``,
``checkpoint.ckpt_format``, ``tokenizer.tokenizer_type``, ...) are refused by the override layer already.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mbridge_offload.facts.config_tree import get_path, show
from mbridge_offload.facts.key_ranges import show_typed
from mbridge_offload.facts.spelling import close_words
from mbridge_offload.validation.guard import guarded
from mbridge_offload.validation.rule import CHOICES, Context, Rule

@dataclass(frozen=True)
class WordChoice:
    """The words one key admits, as the library that reads the key spells them."""

    id: str
    key: str
    words: tuple[str, ...]  # the words listed (and suggested), in the library's order
    what: str  # what the key selects, for the rule's words
    default: str  # what the fix names when no word is close ("null" where null is allowed: e.g. fp8 off)
    null_allowed: bool = False  # None (null) is a value the library reads (e.g. fp8 off)
    list_allowed: bool = False  # a list of the words is read too (one load-balancing type per aux loss)
    more_words: tuple[str, ...] = ()  # accepted but not listed or suggested (deprecated spellings)
    more_text: str = ""  # what the rule's words say of more_words
    log_signatures: tuple[str, ...] = ()  # what the library raises after launch on a word outside the set

    def admits(self, value: Any) -> bool:
        if value is None:
            return self.null_allowed
        if isinstance(value, (list, tuple)) and self.list_allowed:
            return len(value) > 0 and all(self._admits_word(item) for item in value)
        return self._admits_word(value)

    def _admits_word(self, value: Any) -> bool:
        return isinstance(value, str) and (value in self.words or value in self.more_words)

    def closest(self, value: Any) -> str | None:
        """The listed word closest to ``value`` (did-you-mean), or None when none is close."""
        text = str(value).lower()
        by_case = {word.lower(): word for word in self.words}  # normalization=rmsnorm -> RMSNorm
        if text in by_case:
            return by_case[text]
        close = close_words(text, by_case, n=1, cutoff=0.6)
        return by_case[close[0]] if close else None

    @property
    def allowed_text(self) -> str:
        listed = ", ".join(self.words) + (" or null" if self.null_allowed else "")
        return listed + (f"; {self.more_text}" if self.more_text else "")

    @property
    def text(self) -> str:
        as_list = " (or a list of them)" if self.list_allowed else ""
        return f"{self.what}: must be one of {self.allowed_text}{as_list}"

    def fix(self, value: Any) -> str:
        """The override to paste (the closest word, or the default), with the allowed words."""
        allowed = f"allowed: {self.allowed_text}"
        if self.list_allowed and isinstance(value, (list, tuple)) and value:
            items = [item if self._admits_word(item) else (self.closest(item) or self.default) for item in value]
            guesses = [f"{item} -> {self.closest(item)}" for item in value
                       if not self._admits_word(item) and self.closest(item)]
            hint = f"did you mean {', '.join(guesses)}? " if guesses else ""
            return f"{self.key}=[{','.join(items)}]  ({hint}{allowed})"
        near = None if value is None else self.closest(value)
        if near is not None:
            return f"{self.key}={near}  (did you mean {near}? {allowed})"
        return f"{self.key}={self.default}  ({allowed})"

    @property
    def fix_text(self) -> str:
        return f"{self.key}=<one of {self.allowed_text}>"


_ABSENT = object()


def _value(ctx: Context, key: str) -> Any:
    try:
        return get_path(ctx.cfg, key)
    except (KeyError, AttributeError, TypeError):
        return _ABSENT


# megatron/core/optimizer/emerging_optimizers.py: _EMERGING_OPTIMIZERS, 'muon' and 'adaptive_muon' registered by
# Megatron Core, the rest from the emerging-optimizers package's registry (0.3.0 installed).
EMERGING_OPTIMIZERS = ("muon", "adaptive_muon", "laprop", "lion", "mop", "muon_hyperball", "polargrad", "rekls",
                       "scion", "sinkhorn_muon", "soap", "spel")

# megatron/core/optimizer/__init__.py get_megatron_optimizer: 'adam' and 'sgd' build the standard optimizer
# (_get_megatron_optimizer_based_on_param_groups: if 'adam' / elif 'sgd' / else raise), any other name goes to
# _get_megatron_emerging_optimizer, which strips a deprecated 'dist_' prefix and raises "Unsupported emerging
# optimizer" for a name not in _EMERGING_OPTIMIZERS. Read only when the optimizer is built: after launch.
# Named: optimizer offload's rule reads it too (a word outside it is this rule's problem alone).
OPTIMIZER_WORDS = WordChoice(id="choices/optimizer", key="optimizer.optimizer",
                             words=("adam", "sgd", *EMERGING_OPTIMIZERS), what="the optimizer Megatron Core builds",
                             default="adam", more_words=tuple(f"dist_{name}" for name in EMERGING_OPTIMIZERS),
                             more_text="dist_<emerging optimizer> is a deprecated spelling",
                             log_signatures=(r"Unsupported emerging optimizer: ",))

# Named like OPTIMIZER_WORDS where another rule reads the same key: a word outside the set is this rule's problem
# alone, the other rule judges only words the library knows (one problem for one mistake).
# megatron/core/transformer/transformer_config.py: normalization: Literal['LayerNorm', 'RMSNorm'] (Megatron
# Bridge's GPTModelProvider retypes it as plain str); TENorm (extensions/transformer_engine.py) takes the same
# two and raises otherwise when the model is built. (WrappedTorchNorm also names 'L2Norm', as torch.nn.L2Norm,
# which torch does not have.)
NORMALIZATION_WORDS = WordChoice(id="choices/normalization", key="model.normalization", words=("LayerNorm", "RMSNorm"),
                                 what="the model's normalization layer", default="RMSNorm",
                                 log_signatures=(r"Only LayerNorm and RMSNorm are currently supported",
                                                 r"Only LayerNorm, RMSNorm and L2Norm are currently supported"))

# megatron/core/transformer/transformer_config.py: fp8: Optional[Literal['e4m3', 'hybrid']] (plain
# Optional[str] in GPTModelProvider and MixedPrecisionConfig); fp8_utils.py get_fp8_recipe: if 'e4m3' / elif
# 'hybrid' / else raise "E4M3 and HYBRID are the only supported FP8 formats". None: fp8 off. A mixed_precision
# preset replaces model.fp8 with its own (bridge/training/mixed_precision.py update_config_with_precision_overrides).
FP8_FORMAT_WORDS = WordChoice(id="choices/fp8-format", key="model.fp8", words=("e4m3", "hybrid"), null_allowed=True,
                              what="the FP8 format (null: no FP8; the FP8 recipe is model.fp8_recipe; a mixed_precision "
                                   "preset sets model.fp8 itself)", default="null",
                              log_signatures=(r"E4M3 and HYBRID are the only supported FP8 formats",))

# megatron/core/transformer/moe/router.py TopKRouter: routing 'sinkhorn' / 'quantile_balancing' / else top-k,
# with the aux losses 'aux_loss', 'seq_aux_loss', 'global_aux_loss' (is_aux_loss_enabled); 'none' is named in
# TransformerConfig's docstring and its capacity-factor check. Any other word silently routes top-k with no load
# balancing. A list combines aux-loss types (one moe_aux_loss_coeff each).
MOE_BALANCING_WORDS = WordChoice(id="choices/moe-load-balancing", key="model.moe_router_load_balancing_type",
                                 words=("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "quantile_balancing",
                                        "none"),
                                 list_allowed=True,
                                 what="the MoE router's load balancing (any other word silently routes with none)",
                                 default="aux_loss")

CHOICES_TABLE: tuple[WordChoice, ...] = (
    OPTIMIZER_WORDS,
    NORMALIZATION_WORDS,
    FP8_FORMAT_WORDS,
    WordChoice(id="choices/preset-fp8-format", key="mixed_precision.fp8", words=("e4m3", "hybrid"), null_allowed=True,
               what="the FP8 format of a mixed_precision given as a config (null: no FP8)", default="null"),
    MOE_BALANCING_WORDS,
    # megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py _init_each_parameter_group_buffers:
    # if 'no_shard' / 'optim' / 'optim_grads' / 'optim_grads_params' / else raise (Megatron FSDP builds the buffers
    # after launch); the same four in DistributedDataParallelConfig's docstring.
    WordChoice(id="choices/fsdp-sharding", key="ddp.data_parallel_sharding_strategy",
               words=("no_shard", "optim", "optim_grads", "optim_grads_params"),
               what="Megatron FSDP's sharding strategy", default="no_shard",
               log_signatures=(r"Invalid data_parallel_sharding_strategy: ",)),
    # megatron/core/distributed/fsdp/src/megatron_fsdp/fully_shard.py: the outer (hybrid) DP strategy is 'no_shard'
    # or 'optim', else raise; mcore_fsdp_adapter.py reads it as `!= "no_shard"`, so a typo there silently shards
    # the optimizer across the outer DP groups.
    WordChoice(id="choices/fsdp-outer-sharding", key="ddp.outer_dp_sharding_strategy", words=("no_shard", "optim"),
               what="Megatron FSDP's outer (hybrid) data-parallel sharding (any other word reads as optim)",
               default="no_shard", log_signatures=(r"Invalid Hybrid DP-Outer Sharding Strategy",)),
    # megatron/core/dist_checkpointing/strategies/torch.py get_async_strategy: if 'nvrx' / elif 'mcore' / else raise
    # TypeError (at the first asynchronous save's worker set-up, bridge/training/state.py).
    WordChoice(id="choices/async-checkpoint-strategy", key="checkpoint.async_strategy", words=("nvrx", "mcore"),
               what="the asynchronous checkpoint strategy", default="nvrx",
               log_signatures=(r"async_strategy \S+ is not supported\. Available strategies",)),
    # megatron/bridge/training/utils/train_utils.py report_runtime: 'seconds' / 'minutes' / 'hours' / 'days', else
    # raise ValueError (at the first logged step with logger.log_runtime_to_tensorboard).
    WordChoice(id="choices/runtime-time-unit", key="logger.runtime_time_unit",
               words=("seconds", "minutes", "hours", "days"), what="the unit of the logged run time", default="hours",
               log_signatures=(r"Invalid time_unit: ",)),
)


def _rule(choice: WordChoice) -> Rule:
    return Rule(id=choice.id, mechanism=CHOICES, key=choice.key, text=choice.text,
                applies=lambda c: c is not None and _value(c, choice.key) is not _ABSENT,
                holds=lambda c: choice.admits(_value(c, choice.key)),
                fix=lambda c: choice.fix_text if c is None else choice.fix(_value(c, choice.key)),
                observed=lambda c: show_typed(_value(c, choice.key)), fix_text=choice.fix_text,
                log_signatures=choice.log_signatures)


RULES: tuple[Rule, ...] = guarded(*(_rule(choice) for choice in CHOICES_TABLE))
