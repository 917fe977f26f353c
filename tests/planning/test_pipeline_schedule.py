"""Activations of pipeline stages as Megatron Core's schedules hold them (schedules.py get_pp_rank_microbatches):
1F1B holds PP - s micro batches on stage s, never more than the step has; the interleaved schedule (a virtual
pipeline size) holds 2 (PP - s - 1) + (VPP - 1) x PP + 1 model chunks' micro batches. Counts derived by hand from
the schedule and Qwen3-8B's 36 layers."""

from __future__ import annotations

from overrides import apply_overrides
from mbridge_offload.planning import plan
from mbridge_offload.planning.activations import activation_bytes, layer_activations

EIGHT_B = "qwen3_8b_pretrain_config"  # 36 layers, TP4


def _pp(built, pp: int, *more: str):
    return apply_overrides(built(EIGHT_B), [f"model.pipeline_model_parallel_size={pp}", *more])


def test_interleaved_first_stage_holds_its_warm_up_chunks(built):
    """PP2 VPP2: stage 0 runs 2 (2 - 0 - 1) + (2 - 1) x 2 = 4 warm-up forwards, so 5 micro batches of a 9-layer
    chunk are in flight (not 2 of its 18 layers, as without interleaving)."""
    cfg = _pp(built, 2, "model.virtual_pipeline_model_parallel_size=2", "train.global_batch_size=64")
    layer = layer_activations(cfg)
    assert activation_bytes(cfg, 0, micro_batches=64) == 5 * 9 * layer.bytes_kept
    plain = _pp(built, 2, "train.global_batch_size=64")
    assert activation_bytes(plain, 0, micro_batches=64) == 2 * 18 * layer.bytes_kept
    # the schedule's memory factor 1 + (PP - 1) / (PP x VPP) of the interleaving paper: 1.25 here
    assert activation_bytes(cfg, 0, micro_batches=64) * 4 == activation_bytes(plain, 0, micro_batches=64) * 5


def test_the_plan_counts_the_interleaved_schedule(built):
    """plan() on 8 GPUs (TP4 PP2, DP1) plans more for stage 0 with VPP than without: what run_recipe would run."""
    with_vpp = plan(_pp(built, 2, "model.virtual_pipeline_model_parallel_size=2"), 8)
    without = plan(_pp(built, 2), 8)
    assert not with_vpp.unplanned and not without.unplanned
    assert with_vpp.stages[0].activation_bytes_gpu > without.stages[0].activation_bytes_gpu
    assert with_vpp.stages[0].state_bytes_gpu == without.stages[0].state_bytes_gpu  # same parameters per rank


def test_a_step_with_fewer_micro_batches_than_stages_holds_only_those(built):
    """PP4 on 16 GPUs (DP1): a global batch of 1, 2 or 4 micro batches puts 1, 2 or 4 micro batches of stage 0's
    9 layers in flight; more than PP adds nothing."""
    layer_bytes = {}
    for gbs in (1, 2, 4, 32):
        p = plan(_pp(built, 4, f"train.global_batch_size={gbs}"), 16)
        assert not p.unplanned
        layer_bytes[gbs] = p.stages[0].activation_bytes_gpu
    per_micro_batch = 9 * layer_activations(_pp(built, 4)).bytes_kept
    assert layer_bytes[1] == per_micro_batch
    assert layer_bytes[2] == 2 * per_micro_batch
    assert layer_bytes[4] == layer_bytes[32] == 4 * per_micro_batch


def test_fine_grained_offload_pins_the_micro_batches_a_stage_holds(built):
    """The MoE proxy (4 layers) with fine-grained offload on PP2 (2 GPUs): stage 0 holds 2 micro batches of its 2
    layers when the step has 2 or more, 1 when it has 1, so the pinned host copies halve."""
    cfg = apply_overrides(built("qwen3_30b_a3b_proxy_fine_grained_offload_config"),
                          ["model.pipeline_model_parallel_size=2"])
    one, many = (plan(apply_overrides(cfg, [f"train.global_batch_size={gbs}"]), 2) for gbs in (1, 8))
    assert not one.unplanned and not many.unplanned
    assert many.pinned_bytes_host_per_rank > 0
    assert 2 * one.pinned_bytes_host_per_rank == many.pinned_bytes_host_per_rank
