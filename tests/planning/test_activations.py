"""Activation memory: layer-level and fine-grained activation offload take activations off the GPU."""

from __future__ import annotations

from overrides import apply_overrides
from mbridge_offload.planning import plan
from mbridge_offload.planning.activations import activation_bytes, layer_activations, loss_peak_bytes


def test_activation_offload_lowers_the_plan(built):
    cfg = built("qwen3_1b_proxy_pretrain_config")
    act = apply_overrides(cfg, ["model.cpu_offloading=True", "model.cpu_offloading_num_layers=8"])
    fg = built("qwen3_30b_a3b_proxy_fine_grained_offload_config")
    moe = built("qwen3_30b_a3b_proxy_pretrain_config")
    assert plan(act, 1).activation_bytes_gpu < plan(cfg, 1).activation_bytes_gpu
    assert plan(act, 1).pinned_bytes_host_per_rank > 0
    assert plan(fg, 1, fraction=0).activation_bytes_gpu < plan(moe, 1, fraction=0).activation_bytes_gpu


def test_layer_offload_moves_whole_layers_but_their_non_contiguous_fc1_outputs(built):
    """TE frees offloaded layer i when layer L-N+i starts, so at the loss N layers are on the host; what TE will
    not offload (non-contiguous: the unfused SwiGLU's half-view of fc1's output, the whole output) stays on the
    GPU, and the host pins the rest."""
    cfg = built("qwen3_1b_proxy_pretrain_config")
    act = apply_overrides(cfg, ["model.cpu_offloading=True", "model.cpu_offloading_num_layers=8"])
    layer = layer_activations(act)
    assert layer.bytes_kept == layer_activations(cfg).bytes_kept
    assert layer.not_offloadable_bytes == 4 * cfg.model.ffn_hidden_size * layer.tokens  # bf16, both halves
    moved = layer.bytes_kept - layer.not_offloadable_bytes
    assert activation_bytes(cfg) - activation_bytes(act) == 8 * moved
    assert plan(cfg, 1, fraction=0).pinned_bytes_host_per_rank == 0
    # the host: each copied tensor in its own power-of-two pinned block, 8 layers
    m, tokens = cfg.model, layer.tokens
    h, q, k, ffn = m.hidden_size, m.num_attention_heads * m.kv_channels, m.num_query_groups * m.kv_channels, m.ffn_hidden_size
    copied = [2 * n * tokens for n in (h, h, q, k, k, q, h, h, q, k, ffn, ffn, ffn)]
    copied += [2 * m.kv_channels * m.seq_length] * 4  # RoPE's cos and sin for q and k
    blocks = sum(1 << (b - 1).bit_length() for b in copied)
    assert sum(copied) < blocks < 2 * sum(copied)
    assert plan(act, 1, fraction=0).pinned_bytes_host_per_rank == 8 * blocks
    fused = apply_overrides(act, ["model.bias_activation_fusion=True"])  # SwiGLUFunction keeps its contiguous input
    assert layer_activations(fused).not_offloadable_bytes == 0


def test_fine_grained_offload_pins_every_layers_chosen_tensors(built):
    """The first iteration offloads every layer and PyTorch's host allocator keeps the blocks: expert_fc1's input
    and moe_act's four tensors (SiLU's input half, its output, the linear copy, the product) per layer."""
    cfg = built("qwen3_30b_a3b_proxy_fine_grained_offload_config")
    m, tokens = cfg.model, layer_activations(cfg).tokens
    assert sorted(m.offload_modules) == ["expert_fc1", "moe_act"]
    block = lambda n: 1 << (n - 1).bit_length()
    per_layer = block(2 * m.moe_router_topk * m.hidden_size * tokens)
    per_layer += 4 * block(2 * m.moe_router_topk * m.moe_ffn_hidden_size * tokens)
    assert plan(cfg, 1, fraction=0).pinned_bytes_host_per_rank == m.num_layers * per_layer


def test_full_recompute_keeps_the_checkpoints_inputs_and_rebuilds_one_chunk_after_the_loss(built):
    """recompute.checkpointed_forward: uniform chunks of N layers keep each chunk's input and rebuild N layers at
    a time; block keeps the inputs of its first N layers and everything of the rest, rebuilding one layer. The
    rebuild happens in backward, after the loss's tensors are gone: the peak is the larger of the two."""
    cfg = built("qwen3_1b_proxy_pretrain_config")
    layers = cfg.model.num_layers
    layer = layer_activations(cfg)
    loss = loss_peak_bytes(cfg, layer.tokens)
    assert activation_bytes(cfg) == layers * layer.bytes_kept + loss
    full = ["model.recompute_granularity=full"]
    for n in (2, 8):
        uniform = apply_overrides(cfg, full + ["model.recompute_method=uniform", f"model.recompute_num_layers={n}"])
        assert activation_bytes(uniform) == (layers // n) * layer.input_bytes + max(n * layer.bytes_kept, loss)
    assert 8 * layer.bytes_kept > loss > 2 * layer.bytes_kept  # both sides of the max are taken above
    block4 = apply_overrides(cfg, full + ["model.recompute_method=block", "model.recompute_num_layers=4"])
    assert activation_bytes(block4) == 4 * layer.input_bytes + (layers - 4) * layer.bytes_kept + max(layer.bytes_kept, loss)
    assert layer.input_bytes < layer.bytes_kept


def test_a_dense_qwen3_layer_keeps_the_tensors_its_code_saves(built):
    """Qwen3-0.6B (TE spec, q/k norms, unfused RoPE and SwiGLU), bytes per token, tensor by tensor as the layers'
    code saves them (megatron-core 0.19.2, TE 2.20), and the loss's peak with TE's fused and the unfused cross
    entropy."""
    cfg = apply_overrides(built("qwen3_0p6b_pretrain_config"), ["model.seq_length=4096", "dataset.seq_length=4096",
                                                                 "train.micro_batch_size=1", "train.global_batch_size=1"])
    m = cfg.model
    h, ffn, q, kv = m.hidden_size, m.ffn_hidden_size, m.num_attention_heads * m.kv_channels, m.num_query_groups * m.kv_channels
    saved = {"layer input": 2 * h, "qkv norm output": 2 * h, "q copy for its norm": 2 * q, "k copy for its norm": 2 * kv,
             "q after RoPE": 2 * q, "k after RoPE": 2 * kv, "v copy": 2 * kv, "attention output": 2 * q,
             "residual": 2 * h, "fc1 norm output": 2 * h, "fc1 output": 2 * 2 * ffn, "SiLU output": 2 * ffn,
             "linear half + offset": 2 * ffn, "product (fc2 input)": 2 * ffn,
             "fp32 statistics": 4 * (2 + 2 * m.num_attention_heads + m.num_query_groups)}
    rope = 8 * m.kv_channels * 4096  # cos and sin for q and k, fp32, per position
    assert layer_activations(cfg).bytes_kept == sum(saved.values()) * 4096 + rope
    tokens, vocab = 4096, m.vocab_size
    fused = loss_peak_bytes(cfg, tokens)
    assert fused == 2 * 2 * h * tokens + 4 * tokens * vocab + 12 * tokens  # logits and TE's bf16 copy
    unfused = loss_peak_bytes(apply_overrides(cfg, ["model.cross_entropy_loss_fusion=False"]), tokens)
    assert unfused - fused == 2 * tokens * vocab  # the fp32 copy instead of a bf16 one


def test_selective_recompute_drops_what_the_modules_rebuild(built):
    dense = built("qwen3_1b_proxy_pretrain_config")
    moe = built("qwen3_30b_a3b_proxy_pretrain_config")
    selective = "model.recompute_granularity=selective"
    kept = lambda cfg, modules: layer_activations(apply_overrides(cfg, [selective, f"model.recompute_modules=[{modules}]"])).bytes_kept
    # core_attn: TE's fused attention stores no score matrix, so the same tensors stay; layernorm: the dense
    # layer's norms are fused into the linears (nothing to rebuild), the MoE layer's pre-MLP norm is not
    assert kept(dense, "core_attn") == kept(dense, "layernorm") == layer_activations(dense).bytes_kept
    assert kept(dense, "mlp") < layer_activations(dense).bytes_kept
    assert kept(moe, "moe") < kept(moe, "moe_act") < layer_activations(moe).bytes_kept
    assert kept(moe, "layernorm") < layer_activations(moe).bytes_kept


def test_experts_see_their_sequence_parallel_share_gathered_over_expert_tensor_parallel(built):
    """Megatron requires sequence parallel for MoE with TP > 1: a rank routes top-k of its tokens/TP, and the
    experts' alltoall gathers over expert tensor parallel; a null ETP is TP's size."""
    cfg = built("qwen3_30b_a3b_pretrain_config")  # TP2 PP2 EP4 ETP1, sequence parallel
    assert cfg.model.tensor_model_parallel_size == 2 and cfg.model.sequence_parallel
    etp1 = layer_activations(apply_overrides(cfg, ["model.expert_tensor_parallel_size=1"])).bytes_kept
    etp2 = layer_activations(apply_overrides(cfg, ["model.expert_tensor_parallel_size=2"])).bytes_kept
    assert etp2 > etp1  # twice the routed tokens, each half as wide: fc1's input doubles
    null = apply_overrides(cfg, ["model.expert_tensor_parallel_size=null"])
    assert plan(null, 16, fraction=0.5) == plan(apply_overrides(cfg, ["model.expert_tensor_parallel_size=2"]), 16,
                                                fraction=0.5)


def test_what_megatron_does_not_offload_stays_in_the_plan(built):
    """Fine-grained attn_norm/mlp_norm on a dense TE layer (fused norms: transformer_layer.py turns them off) and
    layer-level offload of weights only (TE 2.20 offloads nothing then) leave the activations where they are."""
    dense = built("qwen3_1b_proxy_pretrain_config")
    norms = apply_overrides(dense, ["model.fine_grained_activation_offloading=True",
                                    "model.offload_modules=[attn_norm,mlp_norm]"])
    assert activation_bytes(norms) == activation_bytes(dense)
    assert plan(norms, 1, fraction=0).pinned_bytes_host_per_rank == 0
    weights = apply_overrides(dense, ["model.cpu_offloading=True", "model.cpu_offloading_num_layers=4",
                                      "model.cpu_offloading_activations=False", "model.cpu_offloading_weights=True"])
    assert activation_bytes(weights) == activation_bytes(dense)
    assert plan(weights, 1, fraction=0).pinned_bytes_host_per_rank == 0


def test_layer_offload_of_moe_layers_keeps_the_experts_fc1_outputs(built):
    moe = built("qwen3_30b_a3b_proxy_pretrain_config")
    act = apply_overrides(moe, ["model.cpu_offloading=True", "model.cpu_offloading_num_layers=3"])
    layer = layer_activations(act)
    m = moe.model
    assert layer.not_offloadable_bytes == 4 * m.moe_router_topk * m.moe_ffn_hidden_size * layer.tokens
