"""Activation memory: layer-level and fine-grained activation offload take activations off the GPU."""

from __future__ import annotations

from overrides import apply_overrides
from mbridge_offload.planning import plan
from mbridge_offload.planning.activations import activation_bytes, layer_activations


def test_activation_offload_lowers_the_plan(built):
    cfg = built("qwen3_1b_proxy_pretrain_config")
    act = apply_overrides(cfg, ["model.cpu_offloading=True", "model.cpu_offloading_num_layers=8"])
    fg = built("qwen3_30b_a3b_proxy_fine_grained_offload_config")
    moe = built("qwen3_30b_a3b_proxy_pretrain_config")
    assert plan(act, 1).activation_bytes_gpu < plan(cfg, 1).activation_bytes_gpu
    assert plan(act, 1).pinned_bytes_host_per_rank > 0
    assert plan(fg, 1, fraction=0).activation_bytes_gpu < plan(moe, 1, fraction=0).activation_bytes_gpu


def test_layer_offload_keeps_one_offloaded_layer_and_pins_the_rest_on_the_host(built):
    """Offloading k layers removes k - 1 of them from the GPU (the one being copied stays), and the host
    holds all k, pinned, besides what optimizer offload pins."""
    cfg = built("qwen3_1b_proxy_pretrain_config")
    act = apply_overrides(cfg, ["model.cpu_offloading=True", "model.cpu_offloading_num_layers=8"])
    layer = layer_activations(cfg).bytes_kept
    assert layer_activations(act).bytes_kept == layer
    assert activation_bytes(cfg) - activation_bytes(act) == 7 * layer
    assert plan(act, 1, fraction=0).pinned_bytes_host_per_rank == 8 * layer
    assert plan(cfg, 1, fraction=0).pinned_bytes_host_per_rank == 0


def test_full_recompute_keeps_the_checkpoints_inputs_and_rebuilds_one_chunk(built):
    """recompute.checkpointed_forward: uniform chunks of N layers keep each chunk's input and rebuild N layers at
    a time; block keeps the inputs of its first N layers and everything of the rest, rebuilding one layer."""
    cfg = built("qwen3_1b_proxy_pretrain_config")
    layers = cfg.model.num_layers
    layer = layer_activations(cfg)
    logits = activation_bytes(cfg) - layers * layer.bytes_kept
    full = ["model.recompute_granularity=full"]
    uniform2 = apply_overrides(cfg, full + ["model.recompute_method=uniform", "model.recompute_num_layers=2"])
    assert activation_bytes(uniform2) == (layers // 2) * layer.input_bytes + 2 * layer.bytes_kept + logits
    block4 = apply_overrides(cfg, full + ["model.recompute_method=block", "model.recompute_num_layers=4"])
    assert activation_bytes(block4) == 4 * layer.input_bytes + (layers - 4) * layer.bytes_kept + layer.bytes_kept + logits
    assert layer.input_bytes < layer.bytes_kept
    assert activation_bytes(uniform2) < activation_bytes(block4) < activation_bytes(cfg)


def test_selective_recompute_drops_what_the_modules_rebuild(built):
    dense = built("qwen3_1b_proxy_pretrain_config")
    moe = built("qwen3_30b_a3b_proxy_pretrain_config")
    selective = "model.recompute_granularity=selective"
    kept = lambda cfg, modules: layer_activations(apply_overrides(cfg, [selective, f"model.recompute_modules=[{modules}]"])).bytes_kept
    # core_attn: TE's fused attention stores no score matrix, so the same tensors stay
    assert kept(dense, "core_attn") == layer_activations(dense).bytes_kept
    assert kept(dense, "mlp") < kept(dense, "layernorm") < layer_activations(dense).bytes_kept
    assert kept(dense, "layernorm,mlp") < kept(dense, "mlp")
    assert kept(moe, "moe") < kept(moe, "moe_act") < layer_activations(moe).bytes_kept
