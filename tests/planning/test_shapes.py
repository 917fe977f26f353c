"""Model shapes the plugin's recipes do not have, each planned with the numbers of the model Megatron Core builds or
refused by key, rule and fix. A sweep over variants of the plugin's dense Qwen3 0.6B (GQA, QK norm, head_dim 128 with
hidden 1024, tied embeddings) and the Qwen3-30B-A3B proxy (128 experts, top-8, untied): each rank's parameters per
pipeline stage against the GPTModel Megatron Core builds for that rank, on the meta device, in a process that is that
rank of a TP x PP x CP x EP grid of PyTorch's fake process group (its collectives do nothing: only the sizes of the
parallel groups are read). The vocabulary is the one Megatron Bridge's setup gives the model from the tokenizer."""

from __future__ import annotations

import contextlib
import copy
import functools
import math
from unittest import mock

import pytest

from overrides import apply_overrides
from mbridge_offload.planning import plan_problems, plan_with_recommendation
from mbridge_offload.planning.activations import activation_bytes, layer_activations
from mbridge_offload.planning.plannable import unplannable_problems
from mbridge_offload.planning.tensors import named_tensors

DENSE, MOE = "qwen3_0p6b_pretrain_config", "qwen3_30b_a3b_proxy_pretrain_config"


def gpus_per_stage(m) -> int:
    """GPUs of one pipeline stage of the smallest grid that holds TP x CP and EP x ETP (data parallel makes it up)."""
    tp = m.tensor_model_parallel_size
    return math.lcm(tp * m.context_parallel_size, m.expert_model_parallel_size * (m.expert_tensor_parallel_size or tp))


def num_gpus(cfg) -> int:
    return gpus_per_stage(cfg.model) * cfg.model.pipeline_model_parallel_size


@contextlib.contextmanager
def first_rank_of_stage(m, stage: int):
    """This process as the first rank of pipeline stage ``stage`` of ``m``'s grid: Megatron Core's parallel state on a
    fake process group of the grid's size (torch.testing's: one process, collectives that move no data)."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from torch.testing._internal.distributed.fake_pg import FakeStore

    tp = m.tensor_model_parallel_size
    per_stage = gpus_per_stage(m)
    dist.init_process_group("fake", store=FakeStore(), rank=stage * per_stage,
                            world_size=per_stage * m.pipeline_model_parallel_size)
    try:
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=m.pipeline_model_parallel_size,
            context_parallel_size=m.context_parallel_size, expert_model_parallel_size=m.expert_model_parallel_size,
            expert_tensor_parallel_size=m.expert_tensor_parallel_size or tp, create_gloo_process_groups=False,
            virtual_pipeline_model_parallel_size=m.virtual_pipeline_model_parallel_size)
        yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def _vocabulary_as_bridge_sets_it(cfg):
    """``cfg.model`` with the vocabulary Megatron Bridge's setup gives it from the tokenizer it builds (and whether
    provide() pads it to make_vocab_size_divisible_by x TP)."""
    from megatron.bridge.training.setup import _validate_and_set_vocab_size
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    m = copy.deepcopy(cfg.model)
    m.vocab_size, m.should_pad_vocab = _validate_and_set_vocab_size(
        m.vocab_size, build_tokenizer(cfg.tokenizer).vocab_size, cfg.tokenizer.use_tokenizer_vocab_size)
    return m


def megatron_rank_count(cfg, stage: int) -> int:
    """Parameters of the GPTModel Megatron Core builds for the first rank of pipeline stage ``stage`` (each of its
    model chunks with the interleaved schedule), on the meta device, with Megatron Core's local layer spec (the
    Transformer Engine spec's tensors, without its kernels)."""
    import torch
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec

    m = _vocabulary_as_bridge_sets_it(cfg)
    m.perform_initialization, m.use_cpu_initialization, m.gradient_accumulation_fusion = False, True, False
    m.init_model_with_meta_device = True  # else the tied embedding's copy is all-reduced on a GPU
    m.persist_layer_norm = False  # a Transformer Engine or Apex kernel: the local spec's torch LayerNorm has none
    m.sequence_parallel = False  # the same tensors; the local spec's torch LayerNorm refuses it
    m.context_parallel_size = 1  # the same tensors (CP splits the sequence); the local spec's attention refuses it
    m.moe_grouped_gemm, m.moe_token_dispatcher_type = False, "allgather"  # the others allocate on a GPU
    pp = m.pipeline_model_parallel_size
    with first_rank_of_stage(m, stage):
        m.finalize()
        if m.num_moe_experts:  # the block spec places MoE and dense layers as moe_layer_freq says
            m.transformer_layer_spec = functools.partial(get_gpt_decoder_block_spec, use_transformer_engine=False,
                                                         normalization=m.normalization)
        else:
            m.transformer_layer_spec = get_gpt_layer_local_spec(qk_layernorm=m.qk_layernorm,
                                                                normalization=m.normalization)
        vpp = m.virtual_pipeline_model_parallel_size if pp > 1 else None
        chunks = range(vpp) if vpp else [None]
        with mock.patch.object(torch.cuda, "current_device", lambda: "meta"):
            models = [m.provide(pre_process=stage == 0 and not c,
                                post_process=stage == pp - 1 and (c is None or c == vpp - 1), vp_stage=c)
                      for c in chunks]
    return sum(p.numel() for model in models for p in model.parameters())


def planned_counts(cfg) -> list[int]:
    return [sum(t.numel for t in named_tensors(cfg, s)) for s in range(cfg.model.pipeline_model_parallel_size)]


TP2_SP = ["model.tensor_model_parallel_size=2", "model.sequence_parallel=True"]
UNTIED = ["model.share_embeddings_and_output_weights=False"]
NULL_TOKENIZER_VOCAB = ["tokenizer.use_tokenizer_vocab_size=True", "tokenizer.vocab_size=151655"]

SWEEP = [
    # (recipe, overrides); "counted wrong before": the rows of the QKV projection were counted replicated
    (DENSE, []),
    # kv_channels 128 with hidden 1024 / 16 heads (Qwen3's head_dim), and the width Megatron Core derives when null
    (DENSE, ["model.kv_channels=null"]),
    (DENSE, ["model.kv_channels=256", "model.tensor_model_parallel_size=4"]),
    # GQA: one key/value group, two, as many as heads; fewer groups than TP ranks (the QKV rows split over TP)
    (DENSE, ["model.num_query_groups=1"]),
    (DENSE, ["model.num_query_groups=1", "model.tensor_model_parallel_size=4"]),  # counted wrong before
    (DENSE, ["model.num_query_groups=2", "model.tensor_model_parallel_size=8"]),  # counted wrong before
    (DENSE, ["model.num_query_groups=2", "model.tensor_model_parallel_size=4",
             "model.add_qkv_bias=True"]),  # counted wrong before
    (DENSE, ["model.num_query_groups=16", "model.tensor_model_parallel_size=2"]),
    (DENSE, ["model.num_query_groups=null", "model.tensor_model_parallel_size=8"]),
    (DENSE, ["model.qk_layernorm=False", "model.tensor_model_parallel_size=2"]),
    (DENSE, ["model.add_bias_linear=True", "model.add_qkv_bias=True", "model.tensor_model_parallel_size=2"]),
    # attention_output_gate (Qwen3-Next's attention): the QKV projection also makes a gate per query head
    (DENSE, ["model.attention_output_gate=True"]),  # counted wrong before
    (DENSE, ["model.attention_output_gate=True", "model.num_query_groups=1", "model.tensor_model_parallel_size=4",
             "model.add_qkv_bias=True"]),  # counted wrong before
    # tied and untied embeddings with PP: the last stage holds the output layer, or the tied embedding's copy
    (DENSE, ["model.pipeline_model_parallel_size=2"]),
    (DENSE, TP2_SP + ["model.context_parallel_size=2", "model.pipeline_model_parallel_size=2"]),
    (DENSE, ["model.pipeline_model_parallel_size=2", "model.virtual_pipeline_model_parallel_size=7"]),
    (DENSE, UNTIED + ["model.pipeline_model_parallel_size=4", "model.virtual_pipeline_model_parallel_size=7"]),
    (DENSE, ["model.pipeline_model_parallel_size=2", "model.account_for_embedding_in_pipeline_split=True",
             "model.account_for_loss_in_pipeline_split=True"]),
    (DENSE, ["model.pipeline_model_parallel_size=4", "model.tensor_model_parallel_size=2"]),
    (DENSE, UNTIED + ["model.pipeline_model_parallel_size=2"]),
    (DENSE, UNTIED + ["model.pipeline_model_parallel_size=2", "model.num_layers_in_first_pipeline_stage=12",
                      "model.num_layers_in_last_pipeline_stage=16"]),
    # a vocabulary that is no multiple of 128: used unpadded where the model sets it, padded to 128 (or the config's
    # make_vocab_size_divisible_by) x TP where the tokenizer's replaces it
    (DENSE, ["model.vocab_size=151937", "tokenizer.vocab_size=151937"]),
    (DENSE, NULL_TOKENIZER_VOCAB),
    (DENSE, NULL_TOKENIZER_VOCAB + ["model.tensor_model_parallel_size=2"]),
    (DENSE, NULL_TOKENIZER_VOCAB + ["model.tensor_model_parallel_size=4", "model.pipeline_model_parallel_size=2"]),
    (DENSE, NULL_TOKENIZER_VOCAB + ["model.tensor_model_parallel_size=8", "model.make_vocab_size_divisible_by=64"] + UNTIED),
    # gated and not (squared ReLU, GELU), RMSNorm and LayerNorm (a bias beside each weight)
    (DENSE, ["model.gated_linear_unit=False", "python:activation_func=squared_relu"]),
    (DENSE, ["model.gated_linear_unit=False", "python:activation_func=gelu", "model.normalization=LayerNorm",
             "model.add_bias_linear=True"] + TP2_SP),
    # MoE
    (MOE, []),
    (MOE, TP2_SP + ["model.expert_model_parallel_size=4", "model.pipeline_model_parallel_size=2"]),
    (MOE, TP2_SP + ["model.expert_tensor_parallel_size=2", "model.expert_model_parallel_size=2"]),
    (MOE, TP2_SP + ["model.num_query_groups=1"]),  # counted wrong before
    (MOE, ["model.moe_ffn_hidden_size=1536", "model.ffn_hidden_size=4096", "model.expert_model_parallel_size=8"]),
    (MOE, ["model.moe_ffn_hidden_size=null"]),
    (MOE, TP2_SP + ["model.moe_shared_expert_intermediate_size=1024", "model.moe_shared_expert_gate=True"]),
    (MOE, ["model.moe_shared_expert_intermediate_size=1024"]),
    (MOE, TP2_SP + ["model.expert_tensor_parallel_size=1", "model.expert_model_parallel_size=2",
                    "model.moe_shared_expert_intermediate_size=1024"]),
    (MOE, ["model.moe_router_dtype=fp32", "model.moe_router_topk=2"]),
    (MOE, ["model.gated_linear_unit=False", "python:activation_func=squared_relu", "model.normalization=LayerNorm"]),
    (MOE, ["model.pipeline_model_parallel_size=2", "model.share_embeddings_and_output_weights=True"]),
    (MOE, TP2_SP + ["model.attention_output_gate=True"]),  # counted wrong before
    (MOE, TP2_SP + ["model.expert_model_parallel_size=2", "model.pipeline_model_parallel_size=2",
                    "model.virtual_pipeline_model_parallel_size=2"]),
    (MOE, ["model.moe_layer_freq=[1,1,1,1]"]),  # every layer MoE, as a list: was refused as dense among MoE
]


def variant(recipe, name: str, overrides: list[str]):
    """Recipe ``name`` with ``overrides``; ``python:activation_func=<name>`` sets the MLP's activation, a function no
    command-line override sets (Megatron Core's squared ReLU, PyTorch's GELU)."""
    import torch.nn.functional as F
    from megatron.core.activations import squared_relu

    functions = {"squared_relu": squared_relu, "gelu": F.gelu}
    cfg = apply_overrides(recipe(name), [o for o in overrides if not o.startswith("python:")])
    for o in overrides:
        if o.startswith("python:"):
            key, value = o.removeprefix("python:").split("=")
            setattr(cfg.model, key, functions[value])
    return cfg


@pytest.mark.parametrize("name,overrides", SWEEP, ids=[" ".join(o) or n for n, o in SWEEP])
def test_each_stage_counts_the_parameters_megatron_core_builds(recipe, name, overrides):
    """Each rank's parameters, stage by stage, are Megatron Core's, and the plan is of a launch that starts."""
    cfg = variant(recipe, name, overrides)
    assert not unplannable_problems(cfg, num_gpus(cfg)), unplannable_problems(cfg, num_gpus(cfg))
    want = [megatron_rank_count(cfg, s) for s in range(cfg.model.pipeline_model_parallel_size)]
    assert planned_counts(cfg) == want


def _refused_by(cfg, rule_id: str, key: str) -> None:
    """The plan of ``cfg`` is empty and says why by ``key``, with its value, rule and fix."""
    p = plan_with_recommendation(cfg, num_gpus(cfg), fraction=0.5, gpu_memory_gib=139.8)
    assert p.unplanned and p.params_per_rank == 0 and p.total_bytes_gpu == 0
    found = [q for q in plan_problems(p, None) if q.rule_id == rule_id]
    assert found, [q.rule_id for q in plan_problems(p, None)]
    assert found[0].key == key and found[0].value and found[0].rule and found[0].fix and found[0].severity == "error"


SEQ_4095 = ["model.seq_length=4095", "dataset.seq_length=4095"]


@pytest.mark.parametrize("name,overrides,rule_id,key", [
    # Megatron pads no sequence: CP splits it into 2 x CP chunks and SP over TP, and either fails on a remainder
    (DENSE, SEQ_4095 + ["model.context_parallel_size=2"], "parallel/seq-length-cp", "model.seq_length"),
    (DENSE, ["model.seq_length=4098", "dataset.seq_length=4098", "model.context_parallel_size=2"],
     "parallel/seq-length-cp", "model.seq_length"),
    (DENSE, SEQ_4095 + TP2_SP, "parallel/seq-length-sp", "model.seq_length"),
    (MOE, ["model.seq_length=4108", "dataset.seq_length=4108", "model.context_parallel_size=2",
           "model.tensor_model_parallel_size=4", "model.sequence_parallel=True"], "parallel/seq-length-sp",
     "model.seq_length"),
    # a vocabulary the model sets is used unpadded: TP must divide it
    (DENSE, ["model.vocab_size=151937", "tokenizer.vocab_size=151937", "model.tensor_model_parallel_size=2"],
     "parallel/vocab-per-tp", "model.vocab_size"),
    # GQA: the groups must divide the heads, and be a multiple or a divisor of TP
    (DENSE, ["model.num_query_groups=3"], "parallel/heads-per-query-group", "model.num_query_groups"),
    (DENSE, ["model.num_attention_heads=24", "model.num_query_groups=6", "model.tensor_model_parallel_size=4"],
     "parallel/heads-per-tp", "model.tensor_model_parallel_size"),
    # MoE: EP must divide the experts; TP needs sequence parallel
    (MOE, ["model.num_moe_experts=6", "model.moe_router_topk=2", "model.expert_model_parallel_size=4"],
     "parallel/experts-per-ep", "model.expert_model_parallel_size"),
    (MOE, ["model.tensor_model_parallel_size=2"], "parallel/moe-tp-needs-sequence-parallel", "model.sequence_parallel"),
    # latent MoE (Nemotron 3): projections to and from the latent width around experts on it
    (MOE, ["model.moe_latent_size=512"], "memory/unmodeled-moe-latent", "model.moe_latent_size"),
])
def test_a_shape_megatron_refuses_is_refused_by_its_key(recipe, name, overrides, rule_id, key):
    _refused_by(apply_overrides(recipe(name), overrides), rule_id, key)


def test_an_odd_sequence_without_cp_or_sp_is_planned_per_position(recipe):
    """No CP and no SP: Megatron splits no sequence, so 4095 positions run and each keeps what one of 4096 keeps."""
    even = recipe(DENSE)
    odd = apply_overrides(even, SEQ_4095 + ["model.tensor_model_parallel_size=2"])
    assert not unplannable_problems(odd, 2)
    even = apply_overrides(even, ["model.tensor_model_parallel_size=2"])
    assert layer_activations(odd).tokens == 4095
    assert layer_activations(odd).bytes_kept * 4096 == layer_activations(even).bytes_kept * 4095
    assert 0 < activation_bytes(odd) < activation_bytes(even)


def test_a_micro_batch_of_two_with_cp_keeps_two_sequences_of_the_ranks_positions(recipe):
    """CP2 with micro batch 2: a rank holds 2 x seq / 2 tokens, as many as CP1 with micro batch 1; RoPE's cos and sin
    are per position (broadcast over the batch), so half of theirs."""
    one = recipe(DENSE)
    cp2 = apply_overrides(one, ["model.context_parallel_size=2", "train.micro_batch_size=2",
                                "train.global_batch_size=16"])
    assert not unplannable_problems(cp2, 2)
    m = one.model
    assert layer_activations(cp2).tokens == layer_activations(one).tokens == m.seq_length
    rope_per_position = 8 * m.kv_channels  # fp32 cos and sin for q and k
    assert layer_activations(one).bytes_kept - layer_activations(cp2).bytes_kept == rope_per_position * m.seq_length // 2


@pytest.mark.parametrize("freq,dense", [("[0,1,1,1]", "0"), ("[0,0,1,1]", "0, 1"), ("2", "1, 3"), ("3", "1, 2")])
def test_dense_layers_among_moe_layers_are_refused_naming_them(recipe, freq, dense):
    """moe_layer_freq N makes layer i MoE where i % N == 0, a list those marked 1 (Megatron Core's block spec): the
    planner counts experts in every layer of an MoE model, so the dense ones are refused, by number."""
    cfg = apply_overrides(recipe(MOE), [f"model.moe_layer_freq={freq}"])
    _refused_by(cfg, "memory/unmodeled-moe-layer-freq", "model.moe_layer_freq")
    (problem,) = [q for q in unplannable_problems(cfg, 1) if q.key == "model.moe_layer_freq"]
    assert f"makes layers {dense} (0-based) dense" in problem.rule


@pytest.mark.parametrize("freq", ["[1,1,1]", "[1,1,1,1,1]", "[1,2,1,1]", "0"])
def test_a_moe_layer_freq_megatron_cannot_read_is_refused_with_a_fix_that_plans(recipe, freq):
    """A list that is not one 0 or 1 per layer, or 0: Megatron Core raises building the block spec. It was refused as
    dense layers among MoE layers, whose fix (none that keeps the model) is no fix of a typo."""
    cfg = apply_overrides(recipe(MOE), [f"model.moe_layer_freq={freq}"])
    _refused_by(cfg, "memory/moe-layer-freq-pattern", "model.moe_layer_freq")
    (problem,) = [q for q in unplannable_problems(cfg, 1) if q.key == "model.moe_layer_freq"]
    assert str(cfg.model.num_layers) in problem.rule
    assert not unplannable_problems(apply_overrides(cfg, [problem.fix.split()[0]]), 1)


@pytest.mark.parametrize("groups,tp", [(1, 4), (2, 8), (8, 2), (16, 4)])
def test_a_rank_keeps_its_heads_queries_and_its_groups_keys(recipe, groups, tp):
    """The activations of the attention, per token, as Megatron Core's get_query_key_value_tensors makes them: a rank
    keeps heads / TP queries, and groups / TP keys and values, or one group's where TP exceeds the groups (it takes
    its group from the all-gathered QKV). Qwen3 0.6B's q and k norms, unfused RoPE and SwiGLU, without SP."""
    cfg = apply_overrides(recipe(DENSE), [f"model.num_query_groups={groups}", f"model.tensor_model_parallel_size={tp}",
                                          "model.seq_length=4096", "dataset.seq_length=4096"])
    assert not unplannable_problems(cfg, tp)
    m = cfg.model
    h, kv, heads = m.hidden_size, m.kv_channels, m.num_attention_heads // tp
    q, k, ffn, kv_heads = heads * kv, max(groups // tp, 1) * kv, m.ffn_hidden_size // tp, max(groups // tp, 1)
    saved = {"layer input": 2 * h, "qkv norm output": 2 * h, "q and k copies for their norms": 2 * (q + k),
             "q and k after RoPE": 2 * (q + k), "v copy": 2 * k, "attention output": 2 * q, "residual": 2 * h,
             "fc1 norm output": 2 * h, "fc1 output": 2 * 2 * ffn, "SiLU output, linear half, product": 3 * 2 * ffn,
             "fp32 statistics": 4 * (2 + 2 * heads + kv_heads)}
    rope = 8 * kv * 4096  # cos and sin for q and k, fp32, per position
    assert layer_activations(cfg).bytes_kept == sum(saved.values()) * 4096 + rope


def test_the_experts_activations_grow_with_the_tokens_each_is_routed_to(recipe):
    """top-k routing sends each token to k experts: the permuted tokens, the experts' fc1 and activation outputs and
    fc2's inputs are k per token, the rest of the layer the same (bytes affine in k)."""
    kept = {k: layer_activations(apply_overrides(recipe(MOE), [f"model.moe_router_topk={k}"])).bytes_kept
            for k in (1, 2, 4, 8)}
    per_route = kept[2] - kept[1]
    m, tokens = recipe(MOE).model, layer_activations(recipe(MOE)).tokens
    ffn = m.moe_ffn_hidden_size
    # fc1's input (2 h), SwiGLU's fc1 output, SiLU output, linear copy and product (10 ffn), fc2's input (2 ffn)
    assert per_route == (2 * m.hidden_size + 12 * ffn + 22) * tokens  # 22: the router's indices and probabilities
    assert kept[4] - kept[2] == 2 * per_route and kept[8] - kept[4] == 4 * per_route


def test_an_output_gate_keeps_its_sigmoid_and_the_gated_output(recipe):
    """attention_output_gate: Attention._apply_output_gate computes x * sigmoid(gate.float()), keeping the sigmoid's
    fp32 output (4 B per query element) beside the attention output, and the projection keeps the gated output (2 B)
    instead of the attention output, which the attention keeps for its own backward."""
    plain = apply_overrides(recipe(DENSE), ["model.tensor_model_parallel_size=2"])
    gated = apply_overrides(plain, ["model.attention_output_gate=True"])
    assert not unplannable_problems(gated, 2)
    m, tokens = plain.model, layer_activations(plain).tokens
    q = m.num_attention_heads // 2 * m.kv_channels
    assert layer_activations(gated).bytes_kept - layer_activations(plain).bytes_kept == (4 + 2) * q * tokens


@pytest.mark.parametrize("factor,pad,routes", [(2.0, True, 16), (0.5, True, 4), (0.5, False, 4), (2.0, False, 8)])
def test_a_capacity_factor_sets_the_tokens_each_expert_processes(recipe, factor, pad, routes):
    """moe_expert_capacity_factor: an expert takes at most factor x its even share of the top-8 routed tokens; with
    moe_pad_expert_input_to_capacity every expert is padded up to that (token_dispatcher.py), so the experts process
    factor x 8 tokens per token however the router routes (twice the activations at factor 2)."""
    plain = recipe(MOE)
    capped = apply_overrides(plain, [f"model.moe_expert_capacity_factor={factor}",
                                     f"model.moe_pad_expert_input_to_capacity={pad}"])
    assert not unplannable_problems(capped, 1)
    m, tokens = plain.model, layer_activations(plain).tokens
    assert m.moe_router_topk == 8
    per_route = (2 * m.hidden_size + 12 * m.moe_ffn_hidden_size) * tokens  # fc1's input, SwiGLU's, fc2's input
    assert layer_activations(capped).bytes_kept - layer_activations(plain).bytes_kept == (routes - 8) * per_route


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_a_vocabulary_standing_for_a_loaded_tokenizers_is_padded_as_the_tokenizers_will_be(recipe, tp):
    """tokenizer.use_tokenizer_vocab_size with a Hugging Face tokenizer: Megatron Bridge's setup takes the tokenizer's
    vocabulary, known when it loads, and provide() pads it to make_vocab_size_divisible_by x TP; the set
    model.vocab_size stands for it, padded alike (Qwen3's 151936 is 1187 x 128: 152576 rows on TP8), not unpadded."""
    from megatron.bridge.utils.vocab_utils import calculate_padded_vocab_size

    cfg = apply_overrides(recipe(DENSE), [f"model.tensor_model_parallel_size={tp}"])
    cfg.tokenizer.tokenizer_type, cfg.tokenizer.tokenizer_model = "HuggingFaceTokenizer", "Qwen/Qwen3-0.6B"
    cfg.tokenizer.use_tokenizer_vocab_size = True
    m = cfg.model
    rows = calculate_padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, tp)
    (embedding,) = [t for t in named_tensors(cfg, 0) if t.name == "embedding"]
    assert embedding.numel == rows * m.hidden_size // tp
