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
