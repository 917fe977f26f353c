"""What the planner will not plan, said as the validator says it: each key, its value, the rule and the fix.

A plan is of a launch. Where the config breaks an error-severity rule of the validator's table (launch_rules:
a size out of its range, a grid the GPU count, layers, heads, experts or batch do not split into, an offload,
precision, hyperparameter or feature setting run_recipe.py refuses), the run does not start as configured, and
any number the planner gave would be for nothing: it answers with these problems instead (memory_plan.plan's
empty plan, refused by report.plan_problems), all at once, judged on the config as the plan launches it (at
the planned fraction: ``as_planned``), so auto never picks a fraction whose launch is refused. So is a model
built of layers it does not count (Mamba, multi-latent attention, dense layers among MoE layers, multi-token
prediction) or with a vocabulary the tokenizer fills in at launch: its plan would be another model's numbers
(unmodeled_problems). The rules are the validator's own table, called, not copied, so a dry run reports each
once (validation.Report drops the repeat).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
from collections.abc import Iterator
from typing import Any

from mbridge_offload.facts.config_tree import set_path
from mbridge_offload.facts.key_ranges import (OFFLOAD_FRACTION_KEY, OPTIMIZER_OFFLOAD_FRACTION, is_count,
                                              is_number, show_typed)
from mbridge_offload.planning.tensors import (COUNTED_LAYER_SPECS, OLMOE_LAYER_SPEC, layer_spec_name,
                                              moe_layer_pattern, vocab_rows)
from mbridge_offload.validation.problem import Problem

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


def _moe_layer_freq_features(m: Any) -> list[tuple[str, Any, str, str]]:
    """An MoE model whose moe_layer_freq makes some layers dense MLP layers (the planner counts experts in every
    layer of an MoE model), or that Megatron Core cannot read. Every layer MoE, however it is written, is counted."""
    if not getattr(m, "num_moe_experts", None):
        return []
    freq = getattr(m, "moe_layer_freq", 1)
    pattern = moe_layer_pattern(m)
    if pattern is None:
        return [("model.moe_layer_freq", freq,
                 f"moe_layer_freq is a whole number N other than 0 (every N-th layer from the first is an MoE layer) "
                 f"or a list of one 0 (a dense layer) or 1 (an MoE layer) per layer, {m.num_layers} here; Megatron "
                 "Core raises on any other when it builds the model", "memory/moe-layer-freq-pattern")]
    dense = [i for i, moe in enumerate(pattern) if not moe]
    if not dense:
        return []
    shown = ", ".join(map(str, dense[:8])) + (f" ... ({len(dense)} of {m.num_layers})" if len(dense) > 8 else "")
    return [("model.moe_layer_freq", freq,
             f"the planner counts experts in every layer of an MoE model; this moe_layer_freq makes layers {shown} "
             "(0-based) dense MLP layers, whose tensors and activations are not an MoE layer's",
             "memory/unmodeled-moe-layer-freq")]


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
    found.extend(_moe_layer_freq_features(m))
    if getattr(m, "num_moe_experts", None) and getattr(m, "moe_latent_size", None):
        found.append(("model.moe_latent_size", m.moe_latent_size,
                      "MoE latent projections (moe_layer.py: fc1_latent_proj and fc2_latent_proj, hidden to the latent "
                      "width and back, whole on every rank) and experts on the latent width are not counted by the "
                      "planner: it counts experts on the hidden width", "memory/unmodeled-moe-latent"))
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
    offloaded = set(getattr(m, "offload_modules", None) or []) if getattr(m, "fine_grained_activation_offloading",
                                                                          False) else set()
    if "fused_group_mlp" in offloaded:
        found.append(("model.offload_modules", "[" + ",".join(m.offload_modules) + "]",
                      "fine-grained offload of fused_group_mlp moves every tensor the Transformer Engine op fuser's "
                      "grouped MLP saves for backward (experts.py: the whole fused fc1, activation and fc2), which the "
                      "planner does not count: it counts the experts' fc1 input (expert_fc1) and the activation's "
                      "tensors (moe_act) of TE's GroupedLinear", "memory/unmodeled-fused-group-mlp"))
    if getattr(m, "heterogeneous_block_specs", False):
        found.append(("model.heterogeneous_block_specs", True,
                      "layers of different shapes (Llama-Nemotron's heterogeneous blocks): the planner counts every "
                      "layer alike", "memory/unmodeled-heterogeneous"))
    return found


def _fused_group_mlp_fix(m: Any) -> str:
    kept = [name for name in (m.offload_modules or []) if name not in ("fused_group_mlp", "expert_fc1", "moe_act")]
    return ("model.offload_modules=[" + ",".join(kept + ["expert_fc1", "moe_act"]) + "] "
            "model.use_transformer_engine_op_fuser=False  (the experts' fc1 input and activation, which the planner "
            "counts; or size this run by a short measured run, not by this plan)")


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
    fixes = {**FIXES, "memory/unmodeled-fused-group-mlp": _fused_group_mlp_fix(m)} if getattr(
        m, "offload_modules", None) else dict(FIXES)
    fixes["memory/moe-layer-freq-pattern"] = (f"model.moe_layer_freq=1  (every layer MoE; or a list of "
                                              f"{m.num_layers} 0s and 1s, one per layer)")
    problems = [Problem(key=key, value=repr(value) if not isinstance(value, str) else value, rule=rule,
                        fix=fixes.get(rule_id, UNMODELED_FIX), rule_id=rule_id, source=PLANNER_SOURCE)
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


def launch_rules() -> tuple[Any, ...]:
    """The validator's rules a plan must pass: every error-severity rule of the plugin's own concerns in its table
    (validation/registry.py). Each is a launch run_recipe.py refuses at once, and a plan of a launch that does not
    start would be numbers for nothing. Left out: the runtime failures diagnose reads from a log (they never apply
    to a config), and Megatron Bridge's own validate() checks translated (upstream_rules.MECHANISMS), which import
    Megatron Bridge (35 s) where a plan answers from the cache in under a second: run_recipe.py judges those."""
    from mbridge_offload.validation.registry import RULES
    from mbridge_offload.validation.rule import RUNTIME
    from mbridge_offload.validation.upstream_rules import MECHANISMS as UPSTREAM

    return tuple(r for r in RULES if r.severity == "error" and r.mechanism != RUNTIME
                 and (r.mechanism not in UPSTREAM or r.id in UPSTREAM_RULES_THE_PLAN_NEEDS))


# Megatron Core's checks (TransformerConfig's, translated in the validator's table) of what the activation count
# reads, which read the config alone: a recompute module the model does not have (mla_up_proj without multi-latent
# attention, gdn_norm_out without gated delta net, moe_act without grouped GEMM) fails at finalize, and counted it
# would be a module that rebuilds nothing. A shared expert with a bias is counted with none: Megatron Core refuses
# it when it builds the model.
UPSTREAM_RULES_THE_PLAN_NEEDS = frozenset({"recompute/modules-need-features", "moe/shared-expert-bias"})


def _reads_the_fraction(rule: Any) -> bool:
    """Whether ``rule`` judges the offload fraction's value, not only whether optimizer offload is on and offloads
    anything: the fraction's range, and the resume rules, which compare it with the checkpoint's."""
    from mbridge_offload.validation.rule import CHECKPOINT

    return rule.key == OFFLOAD_FRACTION_KEY or rule.mechanism == CHECKPOINT


def as_planned(cfg: Any, fraction: Any) -> Any:
    """``cfg`` as a plan at offload ``fraction`` launches it: that fraction, and optimizer offload on where it
    offloads anything (auto's choice, prepare._apply_auto); ``cfg`` itself where that is what it says already. A
    shallow copy with its own optimizer section: the config is never changed."""
    opt = cfg.optimizer
    switch = bool(opt.optimizer_cpu_offload) or fraction > 0
    if fraction == opt.optimizer_offload_fraction and switch == opt.optimizer_cpu_offload:
        return cfg
    view, view_opt = copy.copy(cfg), copy.copy(opt)
    set_path(view_opt, "optimizer_cpu_offload", switch)
    set_path(view_opt, "optimizer_offload_fraction", fraction)
    set_path(view, "optimizer", view_opt)
    return view


# A search (fraction_search.py) plans one config at up to 21 fractions, and what_would_fit a few changed copies: the
# rule table (about 10 ms a config) is asked once per config object, GPU count and offload state (``_state``) inside
# one, not once per plan. The config does not change during a search; the memo holds each config it keys by id, so
# an id is not reused while it lives, and it ends with the outermost search.
_SEARCH_MEMO: contextvars.ContextVar[dict | None] = contextvars.ContextVar("plannable_search_memo", default=None)


@contextlib.contextmanager
def one_search() -> Iterator[None]:
    """Within it, the rule problems of each config are computed once per GPU count and offload state."""
    token = _SEARCH_MEMO.set({}) if _SEARCH_MEMO.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            _SEARCH_MEMO.reset(token)


def _state(cfg: Any) -> tuple[bool, bool]:
    """What the rules that do not read the fraction's value see of it: offload on, and offloading anything."""
    opt = cfg.optimizer
    fraction = opt.optimizer_offload_fraction
    return bool(opt.optimizer_cpu_offload), bool(is_number(fraction) and fraction > 0)


def _rule_problems(cfg: Any, num_gpus: int, rules: tuple[Any, ...]) -> list[Problem]:
    from mbridge_offload.validation.checks import breaches
    from mbridge_offload.validation.rule import Context

    # The packages an optional feature needs (APEX, mlflow, comet_ml, NVRx, fast-hadamard-transform) are the launch
    # machine's to have, where run_recipe.py judges them; a plan is of the config, made where it may not run (a
    # login node, diagnose of a run made elsewhere). The Transformer Engine the config must suit is this stack's.
    ctx = Context(cfg=cfg, num_gpus=num_gpus, has_module=_launch_machine_has)
    return list(breaches(rules, ctx, source=PLANNER_SOURCE))


def _launch_machine_has(module: str) -> bool:
    return True


def _config_problems(cfg: Any, planned: Any, num_gpus: int) -> list[Problem]:
    """The rule table's errors of the launch ``planned`` (``cfg`` at the planned fraction), then what the planner
    does not model of ``cfg``; the part that does not read the fraction's value from the search's memo."""
    rules = launch_rules()
    by_fraction = tuple(r for r in rules if _reads_the_fraction(r))
    memo = _SEARCH_MEMO.get()
    key = (id(cfg), num_gpus, _state(planned))
    if memo is not None and key in memo:
        kept = memo[key][1]
    else:
        kept = _rule_problems(planned, num_gpus, tuple(r for r in rules if not _reads_the_fraction(r)))
        kept += unmodeled_problems(cfg)
        if memo is not None:
            memo[key] = (cfg, kept)  # the config kept alive: its id is not reused within the search
    return _rule_problems(planned, num_gpus, by_fraction) + kept


def unplannable_problems(cfg: Any, num_gpus: Any, fraction: Any = None) -> tuple[Problem, ...]:
    """Why ``cfg`` on ``num_gpus`` GPUs at offload ``fraction`` (None: the config's own) cannot be planned, as
    problems naming each key, its value, the rule and the fix (empty when it can be planned): the validator's errors
    of that launch (``launch_rules``) and what the planner does not model."""
    if not is_count(num_gpus, 1):
        return (_gpu_count_problem(num_gpus),)
    problems = [] if fraction is None or (is_number(fraction) and 0 <= fraction <= 1) else [_fraction_problem(fraction)]
    try:
        planned = cfg if problems or fraction is None else as_planned(cfg, fraction)
        problems.extend(_config_problems(cfg, planned, num_gpus))
    except Exception as error:  # noqa: BLE001 - the rules are guarded; a config they cannot read is no config to plan
        problems.append(Problem(key="(the config)", value=f"{type(error).__name__}: {error}"[:200],
                                rule="the planner reads the model, parallel and batch sizes of a Megatron Bridge "
                                     "ConfigContainer", fix="build the config from a recipe (run_recipe.py --list)",
                                rule_id="memory/config-readable", source=PLANNER_SOURCE))
    return tuple(_once([p for p in problems if p.severity == "error"]))


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
