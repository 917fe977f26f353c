"""Rules of the parallel grid: what the GPU count, layers, heads, experts, batch and sequence length
must divide. Each fix is computed (the nearest valid size), so that it can be pasted as it is. Beside the
vocabulary's tensor-parallel rule, the other size Megatron checks of it after launch: the tokenizer's."""

from __future__ import annotations

import math

from mbridge_offload.facts.key_ranges import GRID_RANGES, MODEL_COUNT_RANGES, fixed, grid_sane, is_count, show_typed
from mbridge_offload.validation.guard import gpus_ok, guarded, sane
from mbridge_offload.validation.rule import PARALLELISM, Context, Rule
from mbridge_offload.validation.upstream_rules import MODEL


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _nearest(candidates: list[int], target: int) -> int:
    return min(candidates, key=lambda c: (abs(c - target), c))


def _grid(ctx: Context) -> str:
    m = ctx.model
    return (f"{m.tensor_model_parallel_size} (TP{m.tensor_model_parallel_size} x "
            f"PP{m.pipeline_model_parallel_size} x CP{m.context_parallel_size} = {ctx.model_parallel} "
            f"GPUs per model replica; {ctx.num_gpus} GPU{'s' if ctx.num_gpus != 1 else ''} given)")


def _fix_world(ctx: Context) -> str:
    mp = ctx.model_parallel
    return (f"--num-gpus {mp * max(1, math.ceil(ctx.num_gpus / mp))}  (a multiple of {mp}), "
            "or smaller model.tensor_model_parallel_size / pipeline / context parallel sizes")


def _uneven_pipeline(ctx: Context) -> bool:
    m = ctx.model
    return any(getattr(m, name, None) for name in (
        "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
        "pipeline_model_parallel_layout", "account_for_embedding_in_pipeline_split",
        "account_for_loss_in_pipeline_split"))


def _fix_pp(ctx: Context) -> str:
    pp = _nearest(_divisors(ctx.model.num_layers), ctx.model.pipeline_model_parallel_size)
    return f"model.pipeline_model_parallel_size={pp}"


def _batch_unit(ctx: Context) -> int:
    return ctx.cfg.train.micro_batch_size * (ctx.dp or 1)


def _fix_global_batch(ctx: Context) -> str:
    unit = _batch_unit(ctx)
    gbs = ctx.cfg.train.global_batch_size
    return f"train.global_batch_size={max(unit, round(gbs / unit) * unit)}"


def _fix_ep(ctx: Context) -> str:
    decoder_ranks = ctx.num_gpus // ctx.model.pipeline_model_parallel_size
    etp = ctx.sizes.etp  # null: the tensor parallel size, as Megatron reads it
    options = [d for d in _divisors(ctx.num_experts or 1)
               if decoder_ranks % (d * etp) == 0] or [1]
    return f"model.expert_model_parallel_size={_nearest(options, ctx.model.expert_model_parallel_size)}"


def _groups_split(groups: int, tp: int) -> bool:
    """Megatron Core splits the query groups over TP ranks; with fewer groups than ranks it splits the whole QKV
    projection and each rank takes one group's key and value from its all-gather (transformer_config.py,
    attention.py): a multiple or a divisor of TP."""
    return groups % tp == 0 or tp % groups == 0


def _fix_tp_heads(ctx: Context) -> str:
    m = ctx.model
    groups = m.num_query_groups or m.num_attention_heads
    options = [d for d in _divisors(m.num_attention_heads) if _groups_split(groups, d)]
    return f"model.tensor_model_parallel_size={_nearest(options, m.tensor_model_parallel_size)}"


def _fix_query_groups(ctx: Context) -> str:
    m = ctx.model
    return f"model.num_query_groups={_nearest(_divisors(m.num_attention_heads), m.num_query_groups)}"


def _fix_seq_length_cp(ctx: Context) -> str:
    unit = 2 * ctx.model.context_parallel_size
    return f"--seq-length {math.ceil(ctx.model.seq_length / unit) * unit}"


def _fix_seq_length_sp(ctx: Context) -> str:
    m = ctx.model
    cp = m.context_parallel_size
    multiple = cp * math.lcm(m.tensor_model_parallel_size, 2 if cp > 1 else 1)
    seq = math.ceil(m.seq_length / multiple) * multiple
    return (f"model.seq_length={seq} dataset.seq_length={seq}  (a multiple of {multiple}; or "
            "model.sequence_parallel=False on a dense model)")


def _interleaved(ctx: Context) -> bool:
    """Whether the run uses Megatron Core's interleaved pipeline schedule: model chunks (VPP) on several stages
    (with one stage the model is built as one chunk and VPP is not read)."""
    m = ctx.model
    return m.pipeline_model_parallel_size > 1 and getattr(m, "virtual_pipeline_model_parallel_size", None) is not None


def _fix_vpp(ctx: Context) -> str:
    per_stage = ctx.model.num_layers // ctx.model.pipeline_model_parallel_size
    vpp = _nearest([d for d in _divisors(per_stage) if d > 1] or [1], ctx.model.virtual_pipeline_model_parallel_size)
    return (f"model.virtual_pipeline_model_parallel_size={vpp}  (a divisor of the {per_stage} layers per stage; "
            "or null: no interleaving)")


def _micro_batch_group(ctx: Context) -> int:
    """Micro batches the interleaved schedule runs contiguously on one model chunk (null: the pipeline size)."""
    m = ctx.model
    return getattr(m, "microbatch_group_size_per_vp_stage", None) or m.pipeline_model_parallel_size


def _interleaved_micro_batches_hold(ctx: Context) -> bool:
    """Megatron Core's interleaved schedule (schedules.py) raises at the first step unless PP <= group <= micro
    batches and the last group is whole or at least PP long."""
    pp, group = ctx.model.pipeline_model_parallel_size, _micro_batch_group(ctx)
    micro_batches = ctx.cfg.train.global_batch_size // _batch_unit(ctx)
    rest = micro_batches % group
    return pp <= group <= micro_batches and (rest == 0 or rest >= pp)


def _fix_interleaved_micro_batches(ctx: Context) -> str:
    pp, group = ctx.model.pipeline_model_parallel_size, _micro_batch_group(ctx)
    if group < pp:
        return f"model.microbatch_group_size_per_vp_stage=null  (the pipeline size, {pp})"
    unit = _batch_unit(ctx) * group
    gbs = ctx.cfg.train.global_batch_size
    return (f"train.global_batch_size={max(unit, round(gbs / unit) * unit)}  (a multiple of micro batch x DP x "
            f"{group}, the interleaved schedule's group of micro batches), or model.virtual_pipeline_model_parallel_size=null")


def _next_multiple(value: int, unit: int) -> int:
    return max(unit, math.ceil(value / unit) * unit)


def _expert_ffn(ctx: Context) -> int:
    """An expert's MLP width (model.moe_ffn_hidden_size, null: model.ffn_hidden_size)."""
    return ctx.model.moe_ffn_hidden_size or ctx.model.ffn_hidden_size


# Megatron Core builds its tensor-parallel linears with divide() (tensor_parallel/layers.py, extensions/
# transformer_engine.py), which asserts when the model is built, after the job has started: the widths each splits.
VOCAB_PADDING = 128  # Megatron's make_vocab_size_divisible_by default: how a tokenizer's vocabulary is padded

# Tokenizers whose vocabulary is known before launch: Megatron Core's NullTokenizer reports tokenizer.vocab_size as it
# is (core/tokenizers/text/libraries/null_tokenizer.py). Every other tokenizer's is known only once its files are
# loaded, at launch (a Hugging Face one may need the hub).
VOCAB_FROM_CONFIG_TOKENIZERS = ("NullTokenizer",)


def _tokenizer_vocab(ctx: Context) -> int | None:
    """The vocabulary size the tokenizer will report at setup, where the config alone says it; else None."""
    tokenizer = getattr(ctx.cfg, "tokenizer", None)
    if tokenizer is None or getattr(tokenizer, "tokenizer_type", None) not in VOCAB_FROM_CONFIG_TOKENIZERS:
        return None
    size = getattr(tokenizer, "vocab_size", None)
    return size if is_count(size, 1) else None


def _model_vocab_checked_against_tokenizer(ctx: Context) -> bool:
    """Megatron Bridge's setup (_validate_and_set_vocab_size) compares a model.vocab_size that is set with the
    tokenizer's, unless tokenizer.use_tokenizer_vocab_size replaces the model's with the tokenizer's."""
    tokenizer = getattr(ctx.cfg, "tokenizer", None)
    return (is_count(ctx.model.vocab_size, 1) and _tokenizer_vocab(ctx) is not None
            and not getattr(tokenizer, "use_tokenizer_vocab_size", False))


def _given_vocab_replaced(ctx: Context) -> bool:
    """The command line gave model.vocab_size, and tokenizer.use_tokenizer_vocab_size puts the tokenizer's in its
    place at setup."""
    return (ctx.given("model.vocab_size") and is_count(ctx.model.vocab_size, 1)
            and bool(getattr(getattr(ctx.cfg, "tokenizer", None), "use_tokenizer_vocab_size", False)))


def _given_vocab_observed(ctx: Context) -> str:
    tokenizer = ctx.cfg.tokenizer
    known = _tokenizer_vocab(ctx)
    trains = (f"the {tokenizer.tokenizer_type}'s tokenizer.vocab_size={known}" if known is not None else
              f"the vocabulary of the {tokenizer.tokenizer_type} ({show_typed(tokenizer.tokenizer_model)}), "
              "known at launch,")
    return f"{ctx.model.vocab_size} (given; tokenizer.use_tokenizer_vocab_size=True: {trains} trains)"


def _given_vocab_fix(ctx: Context) -> str:
    vocab, known = ctx.model.vocab_size, _tokenizer_vocab(ctx)
    if known is not None and vocab < known:  # Bridge refuses a model vocabulary below the tokenizer's
        return (f"tokenizer.vocab_size={vocab}  (the null tokenizer then has the vocabulary given; or drop "
                f"model.vocab_size={vocab} to train the tokenizer's {known})")
    return (f"tokenizer.use_tokenizer_vocab_size=False  (model.vocab_size={vocab} then trains; Megatron Bridge refuses "
            f"it at setup if it is below the tokenizer's vocabulary), or drop model.vocab_size={vocab} to train the "
            "tokenizer's")


RULES: tuple[Rule, ...] = guarded(
    *(Rule.of_range(PARALLELISM, key_range) for key_range in (*GRID_RANGES, *MODEL_COUNT_RANGES)),
    Rule(id="parallel/world-size", mechanism=PARALLELISM, key="model.tensor_model_parallel_size",
         text="the GPU count must be a multiple of TP x PP x CP",
         applies=lambda c: grid_sane(c.cfg), holds=lambda c: gpus_ok(c) and c.dp is not None, observed=_grid,
         fix=_fix_world, fix_text="--num-gpus <multiple of TP*PP*CP>, or smaller TP/PP/CP"),
    Rule(id="parallel/layers-per-stage", mechanism=PARALLELISM, key="model.pipeline_model_parallel_size",
         text="model.num_layers must be divisible by the pipeline parallel size",
         applies=sane(lambda c: c.model.pipeline_model_parallel_size > 1 and not _uneven_pipeline(c)),
         holds=lambda c: c.model.num_layers % c.model.pipeline_model_parallel_size == 0,
         observed=lambda c: f"{c.model.pipeline_model_parallel_size} (model.num_layers={c.model.num_layers})",
         fix=_fix_pp, fix_text="model.pipeline_model_parallel_size=<divisor of num_layers>"),
    Rule(id="parallel/layers-per-virtual-stage", mechanism=PARALLELISM, key="model.virtual_pipeline_model_parallel_size",
         text="with the interleaved schedule, the layers of a pipeline stage (num_layers / PP) must be divisible by "
              "the virtual pipeline size (Megatron Bridge asserts it when it builds the model)",
         applies=sane(lambda c: _interleaved(c) and not _uneven_pipeline(c)
                      and c.model.num_layers % c.model.pipeline_model_parallel_size == 0),
         holds=lambda c: (c.model.num_layers // c.model.pipeline_model_parallel_size)
         % c.model.virtual_pipeline_model_parallel_size == 0,
         observed=lambda c: (f"{c.model.virtual_pipeline_model_parallel_size} ({c.model.num_layers} layers / "
                             f"PP{c.model.pipeline_model_parallel_size} = "
                             f"{c.model.num_layers // c.model.pipeline_model_parallel_size} per stage)"),
         fix=_fix_vpp, fix_text="model.virtual_pipeline_model_parallel_size=<divisor of num_layers / PP>, or null"),
    Rule(id="parallel/interleaved-micro-batches", mechanism=PARALLELISM, key="train.global_batch_size",
         text="with the interleaved schedule, the micro batches of a step (global batch / (micro batch x DP)) must be "
              "at least model.microbatch_group_size_per_vp_stage (null: PP), which must be at least PP, and the last "
              "group must be whole or at least PP long (Megatron Core raises at the first step otherwise)",
         applies=sane(lambda c: _interleaved(c) and c.dp is not None
                      and c.cfg.train.global_batch_size % _batch_unit(c) == 0),
         holds=_interleaved_micro_batches_hold,
         observed=lambda c: (f"{c.cfg.train.global_batch_size} ({c.cfg.train.global_batch_size // _batch_unit(c)} "
                             f"micro batches of micro batch {c.cfg.train.micro_batch_size} x DP {c.dp}; groups of "
                             f"{_micro_batch_group(c)}, PP{c.model.pipeline_model_parallel_size})"),
         fix=_fix_interleaved_micro_batches,
         fix_text="train.global_batch_size=<multiple of micro_batch_size*DP*PP>, or "
                  "model.virtual_pipeline_model_parallel_size=null"),
    Rule(id="parallel/global-batch", mechanism=PARALLELISM, key="train.global_batch_size",
         text="train.global_batch_size must be divisible by micro_batch_size x data-parallel size",
         applies=sane(lambda c: c.dp is not None), holds=lambda c: c.cfg.train.global_batch_size % _batch_unit(c) == 0,
         observed=lambda c: (f"{c.cfg.train.global_batch_size} (micro batch {c.cfg.train.micro_batch_size} "
                             f"x DP {c.dp} = {_batch_unit(c)})"),
         fix=_fix_global_batch, fix_text="train.global_batch_size=<multiple of micro_batch_size*DP>"),
    Rule(id="parallel/heads-per-query-group", mechanism=PARALLELISM, key="model.num_query_groups",
         text="the attention heads must be divisible by the query groups (each group serves as many heads)",
         applies=sane(lambda c: c.model.num_query_groups is not None),
         holds=lambda c: c.model.num_attention_heads % c.model.num_query_groups == 0,
         observed=lambda c: f"{c.model.num_query_groups} (heads {c.model.num_attention_heads})",
         fix=_fix_query_groups, fix_text="model.num_query_groups=<divisor of num_attention_heads>"),
    Rule(id="parallel/heads-per-tp", mechanism=PARALLELISM, key="model.tensor_model_parallel_size",
         text="attention heads must be divisible by the tensor parallel size, and query groups a multiple or a divisor "
              "of it (fewer groups than ranks: each rank holds one, replicated)",
         applies=sane(lambda c: True),
         holds=lambda c: c.model.num_attention_heads % c.model.tensor_model_parallel_size == 0
         and _groups_split(c.model.num_query_groups or c.model.num_attention_heads, c.model.tensor_model_parallel_size),
         observed=lambda c: (f"{c.model.tensor_model_parallel_size} (heads {c.model.num_attention_heads}, "
                             f"query groups {c.model.num_query_groups})"),
         fix=_fix_tp_heads, fix_text="model.tensor_model_parallel_size=<divisor of the heads, multiple or divisor of the query groups>"),
    Rule(id="parallel/ffn-per-tp", mechanism=PARALLELISM, key="model.ffn_hidden_size",
         text="the MLP width must be divisible by the tensor parallel size (Megatron Core asserts it when it builds "
              "the model's fc2)",
         applies=sane(lambda c: c.num_experts == 0 and c.model.ffn_hidden_size is not None),
         holds=lambda c: c.model.ffn_hidden_size % c.model.tensor_model_parallel_size == 0,
         observed=lambda c: f"{c.model.ffn_hidden_size} (TP{c.model.tensor_model_parallel_size})",
         fix=lambda c: (f"model.ffn_hidden_size={_next_multiple(c.model.ffn_hidden_size, c.model.tensor_model_parallel_size)}"
                        "  (or a tensor parallel size that divides it)"),
         fix_text="model.ffn_hidden_size=<multiple of TP>, or a TP that divides it"),
    Rule(id="parallel/expert-ffn-per-etp", mechanism=PARALLELISM, key="model.moe_ffn_hidden_size",
         text="an expert's MLP width (model.moe_ffn_hidden_size, null: model.ffn_hidden_size) must be divisible by the "
              "expert tensor parallel size (null: TP's; Megatron Core asserts it when it builds the experts)",
         applies=sane(lambda c: c.num_experts > 0 and is_count(_expert_ffn(c), 1)),  # else its range reports it
         holds=lambda c: _expert_ffn(c) % c.sizes.etp == 0,
         observed=lambda c: f"{_expert_ffn(c)} (ETP{c.sizes.etp})",
         fix=lambda c: f"model.moe_ffn_hidden_size={_next_multiple(_expert_ffn(c), c.sizes.etp)}  (or model.expert_tensor_parallel_size=1)",
         fix_text="model.moe_ffn_hidden_size=<multiple of ETP>, or model.expert_tensor_parallel_size=1"),
    Rule(id="parallel/vocab-per-tp", mechanism=PARALLELISM, key="model.vocab_size",
         text="a vocabulary size set in the model is used unpadded (Megatron Bridge pads only one it takes from the "
              "tokenizer): it must be divisible by the tensor parallel size, which splits the embedding and the output "
              "layer (Megatron Core asserts it when it builds the model)",
         applies=sane(lambda c: c.model.vocab_size is not None
                      and not getattr(getattr(c.cfg, "tokenizer", None), "use_tokenizer_vocab_size", False)),
         holds=lambda c: c.model.vocab_size % c.model.tensor_model_parallel_size == 0,
         observed=lambda c: f"{c.model.vocab_size} (TP{c.model.tensor_model_parallel_size})",
         fix=lambda c: (f"model.vocab_size="
                        f"{_next_multiple(c.model.vocab_size, VOCAB_PADDING * c.model.tensor_model_parallel_size)}"
                        f"  (padded up to a multiple of {VOCAB_PADDING} x TP, as Megatron pads a tokenizer's)"),
         fix_text="model.vocab_size=<padded up to a multiple of 128 x TP>"),
    Rule(id="model/vocab-below-tokenizer", mechanism=MODEL, key="model.vocab_size",
         text="model.vocab_size, where set, must be at least the tokenizer's vocabulary (Megatron Bridge raises at "
              "setup, after launch, otherwise; checked before launch where the config gives the tokenizer's "
              "vocabulary: the NullTokenizer's tokenizer.vocab_size)",
         applies=sane(_model_vocab_checked_against_tokenizer),
         holds=lambda c: c.model.vocab_size >= _tokenizer_vocab(c),
         observed=lambda c: (f"{c.model.vocab_size} (tokenizer {c.cfg.tokenizer.tokenizer_type} with "
                             f"tokenizer.vocab_size={_tokenizer_vocab(c)})"),
         fix=lambda c: (f"tokenizer.vocab_size={c.model.vocab_size}  (the null tokenizer's ids then stay inside the "
                        f"model's vocabulary; or model.vocab_size={_tokenizer_vocab(c)})"),
         fix_text="tokenizer.vocab_size=<model.vocab_size>, or model.vocab_size=<the tokenizer's vocabulary>",
         log_signatures=(r"Model vocab_size \(\d+\) cannot be smaller than tokenizer's vocab_size",)),
    # tokenizer.use_tokenizer_vocab_size: Bridge's setup returns the tokenizer's vocabulary whatever model.vocab_size
    # says (_validate_and_set_vocab_size, no message). A model.vocab_size the command line gave is the user's: it is
    # refused wherever the tokenizer's vocabulary replaces it with another, or with one known only at launch (a Hugging
    # Face or SentencePiece tokenizer's). One the recipe set (Bridge's own pretraining recipes set both on purpose) is
    # judged on the values alone: the recipes build the NullTokenizer with the model's vocabulary, so where the two
    # differ one of them was changed, and the model's (what the planner counted) is not what trains.
    Rule(id="model/given-vocab-replaced-by-tokenizer", mechanism=MODEL, key="model.vocab_size",
         text="a model.vocab_size given on the command line is replaced at setup by the tokenizer's vocabulary where "
              "tokenizer.use_tokenizer_vocab_size is True (Megatron Bridge, with no message): the run would not "
              "train the vocabulary asked for (refused unless the tokenizer's is known to be the same: the "
              "NullTokenizer's tokenizer.vocab_size)",
         applies=sane(_given_vocab_replaced), holds=lambda c: c.model.vocab_size == _tokenizer_vocab(c),
         observed=_given_vocab_observed, fix=_given_vocab_fix,
         fix_text="tokenizer.use_tokenizer_vocab_size=False (model.vocab_size then trains), or drop model.vocab_size"),
    Rule(id="model/vocab-replaced-by-tokenizer", mechanism=MODEL, key="model.vocab_size",
         text="model.vocab_size is replaced at setup by the tokenizer's vocabulary where "
              "tokenizer.use_tokenizer_vocab_size is True (Megatron Bridge, with no message): a model.vocab_size that "
              "differs is not what trains (checked where the config gives the tokenizer's vocabulary: the "
              "NullTokenizer's tokenizer.vocab_size)",
         applies=sane(lambda c: (bool(getattr(c.cfg.tokenizer, "use_tokenizer_vocab_size", False))
                                 and is_count(c.model.vocab_size, 1) and _tokenizer_vocab(c) is not None
                                 and not c.given("model.vocab_size"))),
         holds=lambda c: c.model.vocab_size == _tokenizer_vocab(c),
         observed=lambda c: (f"{c.model.vocab_size} (tokenizer.use_tokenizer_vocab_size=True: the "
                             f"{c.cfg.tokenizer.tokenizer_type}'s tokenizer.vocab_size={_tokenizer_vocab(c)} trains)"),
         fix=lambda c: (f"tokenizer.vocab_size={c.model.vocab_size}  (the tokenizer then has the model's vocabulary; "
                        + ("or tokenizer.use_tokenizer_vocab_size=False to keep model.vocab_size; "
                           if c.model.vocab_size >= _tokenizer_vocab(c) else "")
                        + f"or model.vocab_size={_tokenizer_vocab(c)} to train with the tokenizer's)"),
         fix_text="tokenizer.vocab_size=<model.vocab_size>, or model.vocab_size=<the tokenizer's vocabulary>",
         severity="warning"),
    Rule(id="parallel/experts-per-ep", mechanism=PARALLELISM, key="model.expert_model_parallel_size",
         text="model.num_moe_experts must be divisible by the expert parallel size",
         applies=sane(lambda c: c.num_experts > 0), holds=lambda c: c.num_experts % c.model.expert_model_parallel_size == 0,
         observed=lambda c: f"{c.model.expert_model_parallel_size} (experts {c.num_experts})",
         fix=_fix_ep, fix_text="model.expert_model_parallel_size=<divisor of num_moe_experts>"),
    Rule(id="parallel/expert-grid", mechanism=PARALLELISM, key="model.expert_model_parallel_size",
         text="EP x expert TP must divide the GPUs of one pipeline stage (GPUs / PP)",
         applies=sane(lambda c: c.num_experts > 0 and c.num_gpus % c.model.pipeline_model_parallel_size == 0),
         holds=lambda c: (c.num_gpus // c.model.pipeline_model_parallel_size)
         % (c.model.expert_model_parallel_size * c.sizes.etp) == 0,
         observed=lambda c: (f"EP{c.model.expert_model_parallel_size} x ETP{c.sizes.etp}"
                             + (" (null: TP's)" if c.model.expert_tensor_parallel_size is None else "")
                             + f" vs {c.num_gpus // c.model.pipeline_model_parallel_size} GPUs per stage"),
         fix=_fix_ep, fix_text="model.expert_model_parallel_size=<divisor of GPUs/PP>"),
    Rule(id="parallel/moe-tp-needs-sequence-parallel", mechanism=PARALLELISM, key="model.sequence_parallel",
         text="an MoE model with tensor parallel size > 1 needs sequence parallelism (Megatron Core's MoE layer raises "
              "in the first training forward otherwise)",
         applies=sane(lambda c: c.num_experts > 0 and c.model.tensor_model_parallel_size > 1),
         holds=lambda c: bool(c.model.sequence_parallel),
         fix=fixed("model.sequence_parallel=True")),
    Rule(id="parallel/ep-needs-experts", mechanism=PARALLELISM, key="model.expert_model_parallel_size",
         text="expert parallelism needs an MoE model (model.num_moe_experts set)",
         applies=sane(lambda c: c.model.expert_model_parallel_size > 1), holds=lambda c: c.num_experts > 0,
         fix=fixed("model.expert_model_parallel_size=1")),
    Rule(id="parallel/seq-length-match", mechanism=PARALLELISM, key="dataset.seq_length",
         text="dataset.seq_length must equal model.seq_length",
         applies=sane(lambda c: hasattr(c.cfg.dataset, "seq_length")),
         holds=lambda c: c.cfg.dataset.seq_length == c.model.seq_length,
         observed=lambda c: f"{c.cfg.dataset.seq_length} (model.seq_length={c.model.seq_length})",
         fix=lambda c: (f"dataset.seq_length={c.model.seq_length}  "
                        f"(or set both, e.g. --seq-length {c.cfg.dataset.seq_length})"),
         fix_text="set both model.seq_length and dataset.seq_length (--seq-length N)"),
    Rule(id="parallel/seq-length-cp", mechanism=PARALLELISM, key="model.seq_length",
         text="with context parallelism, seq_length must be divisible by 2 x CP",
         applies=sane(lambda c: c.model.context_parallel_size > 1),
         holds=lambda c: c.model.seq_length % (2 * c.model.context_parallel_size) == 0,
         fix=_fix_seq_length_cp, fix_text="--seq-length <multiple of 2*CP>"),
    # sequence parallelism scatters each CP rank's positions over TP along the sequence (_split_along_first_dim)
    Rule(id="parallel/seq-length-sp", mechanism=PARALLELISM, key="model.seq_length",
         text="with sequence parallelism the positions of a CP rank (seq_length / CP) are split over the TP ranks: "
              "they must divide evenly (Megatron Core's scatter in the embedding fails in the first forward)",
         applies=sane(lambda c: bool(c.model.sequence_parallel) and c.model.tensor_model_parallel_size > 1
                      and c.model.seq_length % (2 * c.model.context_parallel_size
                                                if c.model.context_parallel_size > 1 else 1) == 0),
         holds=lambda c: (c.model.seq_length // c.model.context_parallel_size) % c.model.tensor_model_parallel_size == 0,
         observed=lambda c: (f"{c.model.seq_length} (TP{c.model.tensor_model_parallel_size}, "
                             f"CP{c.model.context_parallel_size}, sequence parallel)"),
         fix=_fix_seq_length_sp,
         fix_text="model.seq_length=<multiple of CP x TP (x 2 with CP)> dataset.seq_length=<the same>, or "
                  "model.sequence_parallel=False on a dense model"),
    Rule(id="parallel/shared-expert-ffn-per-tp", mechanism=PARALLELISM, key="model.moe_shared_expert_intermediate_size",
         text="the shared expert's width must be divisible by the tensor parallel size (its fc1 and fc2 are split over "
              "TP like the dense MLP; Megatron Core's divide() fails when the layer is built)",
         applies=sane(lambda c: c.num_experts > 0
                      and is_count(getattr(c.model, "moe_shared_expert_intermediate_size", None), 1)),
         holds=lambda c: c.model.moe_shared_expert_intermediate_size % c.model.tensor_model_parallel_size == 0,
         observed=lambda c: f"{c.model.moe_shared_expert_intermediate_size} (TP{c.model.tensor_model_parallel_size})",
         fix=lambda c: (f"model.moe_shared_expert_intermediate_size="
                        f"{_next_multiple(c.model.moe_shared_expert_intermediate_size, c.model.tensor_model_parallel_size)}"
                        "  (or a tensor parallel size that divides it)"),
         fix_text="model.moe_shared_expert_intermediate_size=<multiple of TP>, or a TP that divides it"),
)
