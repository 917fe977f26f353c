"""The multi-GPU issue's configurations, validated and planned on the CPU (the runs need 2-4 GPUs)."""

from __future__ import annotations

import pytest

from overrides import apply_overrides
from mbridge_offload.planning import plan
from mbridge_offload.validation import validate
from mbridge_offload.planning.activations import largest_loss_tensor_bytes
from mbridge_offload.planning.memory_plan import base_gpu_bytes, device_total_bytes
from mbridge_offload.planning.outside_pytorch import outside_pytorch_bytes

MOE = "qwen3_30b_a3b_proxy_pretrain_config"


@pytest.mark.parametrize("gpus,overrides", [
    (4, ["model.pipeline_model_parallel_size=2", "model.expert_model_parallel_size=2"]),
    (2, ["model.pipeline_model_parallel_size=2"]),
])
def test_moe_proxy_with_pp_validates(built, gpus, overrides):
    cfg = apply_overrides(built(MOE), overrides)
    for fraction in ("0.0", "0.5", "1.0"):
        cfg_f = apply_overrides(cfg, [f"optimizer.optimizer_offload_fraction={fraction}"])
        assert validate(cfg_f, gpus, environ={}).ok


def test_activation_offload_refused_and_fine_grained_accepted_with_pp(built):
    act = apply_overrides(built("qwen3_1b_proxy_activation_offload_config"), ["model.pipeline_model_parallel_size=2"])
    assert [p.rule_id for p in validate(act, 2, environ={}).errors] == ["activation-offload/pipeline-parallel"]
    fg = apply_overrides(built("qwen3_30b_a3b_proxy_fine_grained_offload_config"),
                         ["model.pipeline_model_parallel_size=2", "model.expert_model_parallel_size=2"])
    assert validate(fg, 4, environ={}).ok



def test_plan_per_stage(built):
    cfg = apply_overrides(built(MOE), ["model.pipeline_model_parallel_size=2", "model.expert_model_parallel_size=2"])
    p = plan(cfg, 4, fraction=0.5, gpu_memory_gib=139.8)
    assert [s.stage for s in p.stages] == [0, 1]
    assert p.total_bytes_gpu == max(s.total_bytes_gpu for s in p.stages)
    assert p.stages[1].activation_bytes_gpu > p.stages[0].activation_bytes_gpu  # logits on the last stage
    allocated = [s.state_bytes_gpu + s.activation_bytes_gpu + base_gpu_bytes(cfg) for s in p.stages]
    expandable = p.allocator_expandable_segments
    loss_tensors = [0, largest_loss_tensor_bytes(cfg)]  # the loss is on the last stage only
    assert [s.total_bytes_gpu for s in p.stages] == [
        device_total_bytes(a, outside_pytorch_bytes(cfg), expandable, loss)[1] for a, loss in zip(allocated, loss_tensors)]
    # More offload, less GPU memory on every stage.
    q = plan(cfg, 4, fraction=1.0)
    assert all(b.total_bytes_gpu < a.total_bytes_gpu for a, b in zip(p.stages, q.stages))
