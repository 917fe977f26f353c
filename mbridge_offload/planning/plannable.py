"""What the planner cannot model, said as the validator says it: each key, its value, the rule and the fix.

The plan divides by the parallel grid and counts over layers, heads and experts. Where the config breaks a
rule those counts depend on (a size out of its range, a GPU count TP x PP x CP does not divide, layers a stage
or a model chunk cannot split evenly, heads or experts a parallel size does not divide, a global batch that is
no whole number of micro batches, two sequence lengths), the run cannot start as configured and any number the
planner gave would be made up: it answers with these problems instead (memory_plan.plan's empty plan, refused by
report.plan_problems). So is a model built of layers it does not count (Mamba, multi-latent attention, dense layers
among MoE layers, multi-token prediction) or with a vocabulary the tokenizer fills in at launch: its plan would be
another model's numbers (unmodeled_problems). The rules are the validator's own (validation/parallelism.py,
facts/key_ranges.py), so a dry run reports each once (validation.Report drops the repeat).
"""

from __future__ import annotations

import math
from typing import Any

from mbridge_offload.facts.key_ranges import (KEY_RANGES, OFFLOAD_FRACTION_KEY, OPTIMIZER_OFFLOAD_FRACTION, is_count,
                                              is_number, show_typed)
from mbridge_offload.planning.tensors import (COUNTED_LAYER_SPECS, OLMOE_LAYER_SPEC, layer_spec_name,
                                              vocab_rows)
from mbridge_offload.validation.problem import Problem

# The validator's rules whose breach leaves the planner's arithmetic without meaning, after the key ranges.
GRID_RULES_THE_PLAN_NEEDS = (
    "parallel/world-size",  # the data-parallel size: optimizer shards, micro batches per step
    "parallel/layers-per-stage",  # the layers of each pipeline stage
    "parallel/layers-per-virtual-stage",  # the layers of each model chunk of the interleaved schedule
    "parallel/global-batch",  # micro batches per step: how many a pipeline stage holds
    "parallel/interleaved-micro-batches",  # the interleaved schedule's micro batches in flight
    "parallel/heads-per-query-group",  # heads per key/value group
    "parallel/heads-per-tp",  # heads and query groups per rank
    "parallel/ffn-per-tp",  # the MLP's width per rank
    "parallel/expert-ffn-per-etp",  # an expert's width per rank
    "parallel/vocab-per-tp",  # the embedding's and output layer's rows per rank
    "parallel/experts-per-ep",  # experts per rank
    "parallel/expert-grid",  # the expert-data-parallel group: expert optimizer shards
    "parallel/seq-length-match",  # one sequence length for the activations and the data loader
    "parallel/seq-length-cp",  # positions per rank under context parallelism
    "parallel/seq-length-sp",  # positions per rank under sequence parallelism
    "parallel/shared-expert-ffn-per-tp",  # the shared expert's width per rank
    "pipeline/one-layout-way",  # the layers of each stage: one way of splitting them
    "pipeline/uneven-stages",  # the layers of the first, last and middle stages
    "pipeline/embedding-loss-split",  # the layers of each stage with the embedding and loss counted as layers
)

PLANNER_SOURCE = "planner"

# The planner counts a GPT model of Megatron Core (tensors.py, activations.py): per layer self-attention with one
# fused QKV projection, then an MLP or a mixture of experts in every layer, an embedding and an output layer of
# model.vocab_size rows. A model built of other layers holds other tensors and saves other activations; its plan
# would be another model's numbers under its name, so it is refused, each feature by its key. No override turns
# such a model into one the planner counts, so the fix says what the plan would need instead.
UNMODELED_FIX = ("none that keeps this model: size it by a short measured run (its peak memory), not by this plan; "
                 "the planner counts GPT models of attention and MLP or MoE layers only")

# Features an override turns into one the planner counts, with the override.
FIXES = {"memory/unmodeled-attention-backend": "model.attention_backend=auto  (or flash, or fused)",
         "memory/unmodeled-pipeline-layout": "model.pipeline_model_parallel_layout=null with the same split given by "
                                             "model.num_layers_in_first_pipeline_stage / "
                                             "num_layers_in_last_pipeline_stage (or an even split)"}


def _subclass_of(obj: Any, class_name: str) -> bool:
    """Whether ``obj``'s class derives from one named ``class_name`` (by name: planning imports no Megatron; a
    cached config's look-alike class derives from stand-ins of the same names, fast_check/snapshot.py)."""
    return any(k.__name__ == class_name for k in type(obj).__mro__)


# The providers whose provide() builds the model the planner counts, by the class that defines the provide() a
# provider inherits: Megatron Core's GPTModel as GPTModelProvider builds it, Gemma's with its embedding scaled (the
# same tensors) and Gemma3's with its own embedding and rotary embedding (the same tensors). A provider that
# defines provide() anew builds another model (a vision-language model around its language model, T5, Wan, Flux,
# a Mamba hybrid), whatever its fields say.
COUNTED_PROVIDERS = frozenset({
    "megatron.bridge.models.gpt_provider.GPTModelProvider",
    "megatron.bridge.models.gemma.gemma_provider.GemmaModelProvider",
    "megatron.bridge.models.gemma.gemma3_provider.Gemma3ModelProvider",
})
GPT_PROVIDER = "GPTModelProvider"


# What a cached config's look-alike class (and each stand-in of a base) notes of its original's methods: the name
# of fast_check.snapshot.DEFINES, which planning does not import (fast_check imports planning).
SNAPSHOT_DEFINES = "__snapshot_defines__"


def _defines(klass: type, method: str) -> bool:
    """Whether ``klass`` defines ``method`` in its own body, or (a look-alike class) its original did."""
    own = vars(klass)
    return method in own or method in own.get(SNAPSHOT_DEFINES, ())


def _qualified(klass: type) -> str:
    return f"{klass.__module__}.{klass.__qualname__}"


def provider_builder(m: Any) -> str | None:
    """The qualified name of the class whose provide() model config ``m`` uses, or None where none defines one."""
    owner = next((k for k in type(m).__mro__ if _defines(k, "provide")), None)
    return None if owner is None else _qualified(owner)


def _provider_problem(m: Any) -> Problem | None:
    """A model provider whose provide() builds another model than the GPT models the planner counts."""
    builder = provider_builder(m)
    if builder in COUNTED_PROVIDERS or _subclass_of(m, "HybridModelProvider"):  # hybrids: memory/unmodeled-mamba
        return None
    name = _qualified(type(m))
    language_model = _subclass_of(m, GPT_PROVIDER)
    built_by = f"its provide() is {builder}.provide" if builder else "it defines no provide()"
    if language_model:
        rule = (f"{type(m).__name__} is a GPT provider whose provide() builds another model ({built_by}): a "
                "vision, audio or other encoder and its projection around the language model, which hold tensors "
                "and activations the planner does not count; it counts Megatron Core's GPTModel as "
                "GPTModelProvider (and Gemma's, Gemma3's) builds it")
        fix = ("plan the language model alone: a GPT recipe with this model's model.* sizes (run_recipe.py --list), "
               "then keep GPU headroom for the encoder, measured by a short run; or set "
               f"{OFFLOAD_FRACTION_KEY}=<a fraction> by hand instead of auto")
    else:
        rule = (f"{type(m).__name__} builds no GPT model ({built_by}): the planner counts Megatron Core's GPTModel "
                "(attention and MLP or MoE layers, an embedding and an output layer) as GPTModelProvider builds it; "
                "an encoder-decoder, diffusion or state-space model holds other tensors and activations")
        fix = ("none that keeps this model: size it by a short measured run (its peak memory), and set "
               f"{OFFLOAD_FRACTION_KEY}=<a fraction> by hand instead of auto")
    return Problem(key="model", value=name, rule=rule, fix=fix, rule_id="memory/unmodeled-model",
                   source=PLANNER_SOURCE)


def _unmodeled_features(m: Any) -> list[tuple[str, Any, str, str]]:
    """(key, value, rule, rule id) of each feature of model config ``m`` the planner's count does not have."""
    found = []
    if _subclass_of(m, "HybridModelProvider"):  # Megatron Bridge's Mamba and hybrid (Nemotron-H) models
        pattern = getattr(m, "hybrid_layer_pattern", None) or getattr(m, "hybrid_override_pattern", None)
        found.append(("model.hybrid_layer_pattern", pattern if pattern else f"None ({type(m).__name__})",
                      "a hybrid model's Mamba layers (M in the pattern) hold SSM tensors and activations the planner "
                      "does not count: it counts attention and MLP layers", "memory/unmodeled-mamba"))
    if getattr(m, "multi_latent_attention", False):
        found.append(("model.multi_latent_attention", True,
                      "multi-latent attention (DeepSeek V2/V3, Kimi) projects queries and keys through low-rank "
                      "down and up projections; the planner counts one fused QKV projection of heads x kv_channels",
                      "memory/unmodeled-mla"))
    freq = getattr(m, "moe_layer_freq", 1)
    if getattr(m, "num_moe_experts", None) and freq != 1:
        found.append(("model.moe_layer_freq", freq,
                      "the planner counts experts in every layer; this model has dense MLP layers among its MoE "
                      "layers", "memory/unmodeled-moe-layer-freq"))
    if getattr(m, "mtp_num_layers", None):
        found.append(("model.mtp_num_layers", m.mtp_num_layers,
                      "multi-token prediction layers (each a transformer layer, a norm pair and a projection) are "
                      "not counted by the planner", "memory/unmodeled-mtp"))
    variant = getattr(m, "experimental_attention_variant", None)
    if variant or getattr(m, "linear_attention_freq", None):
        found.append(("model.experimental_attention_variant", variant if variant else
                      f"None (model.linear_attention_freq={m.linear_attention_freq})",
                      "gated delta net / DSA / linear attention layers hold tensors the planner does not count",
                      "memory/unmodeled-attention-variant"))
    backend = getattr(m, "attention_backend", None)
    if getattr(backend, "name", backend) in ("unfused", "local"):
        found.append(("model.attention_backend", getattr(backend, "name", backend),
                      "the unfused and local attention keep each layer's softmax over sequence x sequence scores for "
                      "backward; the planner counts flash or fused attention, which keeps none",
                      "memory/unmodeled-attention-backend"))
    spec = layer_spec_name(m)
    if spec is not None and spec not in COUNTED_LAYER_SPECS and not getattr(m, "heterogeneous_block_specs", False):
        found.append(("model.transformer_layer_spec", spec,
                      "a layer spec the planner does not count builds other modules than Megatron Bridge's GPT, "
                      "OLMoE and Gemma3 specs (extra norms, other attention or MLP), whose tensors and activations "
                      "the count has not", "memory/unmodeled-layer-spec"))
    layout = getattr(m, "pipeline_model_parallel_layout", None)
    if layout is not None:
        found.append(("model.pipeline_model_parallel_layout", layout if isinstance(layout, str) else repr(layout),
                      "a pipeline layout places the embedding, the layers and the loss stage by stage as it lists "
                      "them; the planner splits the layers evenly, or by num_layers_in_first/last_pipeline_stage, or "
                      "with account_for_embedding/loss_in_pipeline_split", "memory/unmodeled-pipeline-layout"))
    if getattr(m, "heterogeneous_block_specs", False):
        found.append(("model.heterogeneous_block_specs", True,
                      "layers of different shapes (Llama-Nemotron's heterogeneous blocks): the planner counts every "
                      "layer alike", "memory/unmodeled-heterogeneous"))
    return found


def _olmoe_norm_problems(m: Any) -> list[Problem]:
    """OLMoE's q and k norms span all attention heads (olmoe_provider.OLMoESelfAttention): the first forward fails
    on a query or key narrower than that, as a TP shard of the heads or fewer key/value groups than heads are."""
    if layer_spec_name(m) != OLMOE_LAYER_SPEC or not getattr(m, "qk_layernorm", False):
        return []
    heads, tp = m.num_attention_heads, m.tensor_model_parallel_size
    groups = m.num_query_groups or heads
    problems = []
    if is_count(tp, 1) and tp > 1:
        problems.append(Problem(
            key="model.tensor_model_parallel_size", value=repr(tp),
            rule="OLMoE's q and k norms are as wide as all heads (num_attention_heads x kv_channels) and are not "
                 "split by TP: on a rank's share of the heads the first forward fails on the norm's shape",
            fix="model.tensor_model_parallel_size=1  (split OLMoE's experts with model.expert_model_parallel_size)",
            rule_id="memory/olmoe-qk-norm-width", source=PLANNER_SOURCE))
    if groups != heads:
        problems.append(Problem(
            key="model.num_query_groups", value=repr(m.num_query_groups),
            rule=f"OLMoE's k norm is as wide as all {heads} heads: a key of {groups} key/value groups is narrower "
                 "and the first forward fails on the norm's shape",
            fix=f"model.num_query_groups={heads}  (or null)", rule_id="memory/olmoe-qk-norm-width",
            source=PLANNER_SOURCE))
    return problems


def unmodeled_problems(cfg: Any) -> list[Problem]:
    """The model features the planner does not count, each as a problem naming its key, value, rule and fix; and a
    vocabulary left to the tokenizer, whose size the embedding and output layer need."""
    m = cfg.model
    other_model = _provider_problem(m)
    if other_model is not None:  # its layers' features are another model's: the rest would be guesses
        return [other_model]
    problems = [Problem(key=key, value=repr(value) if not isinstance(value, str) else value, rule=rule,
                        fix=FIXES.get(rule_id, UNMODELED_FIX), rule_id=rule_id, source=PLANNER_SOURCE)
                for key, value, rule, rule_id in _unmodeled_features(m)]
    problems.extend(_olmoe_norm_problems(m))
    if vocab_rows(cfg) is None:  # Megatron Bridge sets it from a tokenizer the config does not size, at launch
        problems.append(Problem(
            key="model.vocab_size", value="None",
            rule="the planner counts the embedding and output layer from the vocabulary; model.vocab_size None is "
                 "the tokenizer's, padded to make_vocab_size_divisible_by x TP, and the config says its size only "
                 "for the NullTokenizer (tokenizer.vocab_size): this tokenizer's is known when it loads at launch",
            fix="model.vocab_size=<the tokenizer's vocabulary size, padded as Megatron pads it>",
            rule_id="memory/vocab-size-known", source=PLANNER_SOURCE))
    return problems


def _gpu_count_problem(num_gpus: Any) -> Problem:
    return Problem(key="--num-gpus", value=repr(num_gpus), rule="the GPU count must be a whole number >= 1",
                   fix="--num-gpus 1  (or the GPUs the run will have)", rule_id="memory/gpu-count",
                   source=PLANNER_SOURCE)


def _fraction_problem(fraction: Any) -> Problem:
    """The offload fraction argument out of range, in the words of the key's own range (the validator's), so a
    fraction given on the command line and one in the config are refused alike and said once (``_once``)."""
    rule = OPTIMIZER_OFFLOAD_FRACTION
    return Problem(key=rule.key, value=show_typed(fraction, number=rule.number), rule=rule.text, fix=rule.fix(None),
                   rule_id=rule.id, source=PLANNER_SOURCE)


def unplannable_problems(cfg: Any, num_gpus: Any, fraction: Any = None) -> tuple[Problem, ...]:
    """Why ``cfg`` on ``num_gpus`` GPUs at offload ``fraction`` cannot be planned, as problems naming each key, its
    value, the rule and the fix (empty when it can be planned)."""
    from mbridge_offload.validation.checks import breaches
    from mbridge_offload.validation.registry import RULES_BY_ID
    from mbridge_offload.validation.rule import Context

    if not is_count(num_gpus, 1):
        return (_gpu_count_problem(num_gpus),)
    problems = [] if fraction is None or (is_number(fraction) and 0 <= fraction <= 1) else [_fraction_problem(fraction)]
    ctx = Context(cfg=cfg, num_gpus=num_gpus, environ={})
    try:
        rules = [RULES_BY_ID[r.id] for r in KEY_RANGES] + [RULES_BY_ID[i] for i in GRID_RULES_THE_PLAN_NEEDS]
        # one by one: a rule that raises keeps the problems found before it
        problems.extend(breaches(rules, ctx, severity="error", source=PLANNER_SOURCE))
        problems.extend(unmodeled_problems(cfg))
    except Exception as error:  # noqa: BLE001 - the rules are guarded; a config they cannot read is no config to plan
        problems.append(Problem(key="(the config)", value=f"{type(error).__name__}: {error}"[:200],
                                rule="the planner reads the model, parallel and batch sizes of a Megatron Bridge "
                                     "ConfigContainer", fix="build the config from a recipe (run_recipe.py --list)",
                                rule_id="memory/config-readable", source=PLANNER_SOURCE))
    return tuple(_once(problems))


def _once(problems: list[Problem]) -> list[Problem]:
    """Each (rule, key, value) once: a fraction argument out of range and the config's own may say the same."""
    seen, kept = set(), []
    for p in problems:
        if (p.rule_id, p.key, p.value) not in seen:
            seen.add((p.rule_id, p.key, p.value))
            kept.append(p)
    return kept


def unplannable_text(problems: tuple[Problem, ...]) -> str:
    """The problems in one line each: key = value: rule (fix: ...)."""
    return "; ".join(f"{p.key} = {p.value}: {p.rule} (fix: {p.fix})" for p in problems)
