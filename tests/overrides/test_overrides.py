"""The override layer: Hydra grammar, typed conversion, did-you-mean, purity; ranges left to the validator."""

from __future__ import annotations

import copy

import pytest
import torch

from overrides import OverrideErrors, apply_overrides
from overrides.short_flags import to_overrides
from mbridge_offload.describe import config_diff
from mbridge_offload.validation import validate

DENSE = "qwen3_1b_proxy_pretrain_config"
MOE_FG = "qwen3_30b_a3b_proxy_fine_grained_offload_config"

INT_KEYS = ["train.train_iters", "train.global_batch_size", "train.micro_batch_size", "model.num_layers",
            "model.tensor_model_parallel_size", "model.pipeline_model_parallel_size", "model.context_parallel_size",
            "model.expert_model_parallel_size", "model.cpu_offloading_num_layers", "model.seq_length",
            "dataset.seq_length", "logger.log_interval", "rng.seed", "model.hidden_size",
            "model.num_attention_heads", "model.min_offloaded_tensor_size", "scheduler.lr_warmup_iters",
            "dataset.num_workers", "model.ffn_hidden_size", "model.delta_offload_bytes_across_pp_ranks"]
FLOAT_KEYS = ["optimizer.optimizer_offload_fraction", "optimizer.lr", "optimizer.min_lr", "optimizer.weight_decay",
              "optimizer.adam_beta1", "optimizer.adam_eps", "optimizer.clip_grad", "model.activation_offload_fraction",
              "model.init_method_std", "model.hidden_dropout"]
BOOL_KEYS = ["optimizer.optimizer_cpu_offload", "optimizer.overlap_cpu_optimizer_d2h_h2d",
             "optimizer.use_distributed_optimizer", "model.cpu_offloading", "model.cpu_offloading_weights",
             "model.cpu_offloading_activations", "model.fine_grained_activation_offloading",
             "model.sequence_parallel", "ddp.overlap_grad_reduce", "optimizer.pin_cpu_grads"]

MALFORMED = (
    [f"{k}={v}" for k in INT_KEYS for v in ("abc", "1.5", "True", "[1,2]")]
    + [f"{k}={v}" for k in FLOAT_KEYS for v in ("abc", "True", "[0.5]", "nan")]
    + [f"{k}={v}" for k in BOOL_KEYS for v in ("maybe", "1", "0.5", "[True]", "yes")]
    + [  # null where not allowed, bad choices
        "optimizer.optimizer_offload_fraction=null", "model.offload_modules=expert_fc1", "model.hidden_size=null",
        "optimizer.main_grads_dtype=float64", "model.recompute_method=sometimes", "model.num_layers=null",
        "model.attention_backend=fast", "rng.seed=null",
        "model.cuda_graph_impl=fast", "model.transformer_impl=te", "model.recompute_granularity=partial",
        "optimizer.main_grads_dtype=float64x", "model.moe_token_dispatcher_type=a2a",
    ]
    + [  # unknown keys and typos
        "optimizer.offload_fraction=0.5", "optimizer.optimizer_offload_fractoin=0.5", "model.cpu_offload=True",
        "model.cpu_offloading_num_layer=2", "train.train_iter=5", "trian.train_iters=5", "optimzer.lr=1e-4",
        "model.tensor_parallel_size=2", "foo=1", "model.optimizer_offload_fraction=1",
        "env_vars.NOT_THERE=1", "~env_vars.NOT_THERE", "optimizer.lr.value=1",
    ]
    + [  # grammar
        "optimizer.lr", "optimizer.lr=[1,2", "optimizer.lr='x", "optimizer.lr=1,2", "+optimizer.lr=1",
        "~optimizer.lr=5",
    ]
)


def test_at_least_100_malformed_overrides():
    assert len(MALFORMED) >= 100
    assert len(set(MALFORMED)) == len(MALFORMED)


@pytest.fixture(scope="module")
def dense(built):
    return built(DENSE)


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_override_is_refused_with_the_key_named(dense, text):
    with pytest.raises(OverrideErrors) as caught:
        apply_overrides(dense, [text])
    errors = caught.value.errors
    assert len(errors) == 1
    typed_key = text.lstrip("+~").split("=", 1)[0]
    assert errors[0].key == typed_key
    assert typed_key in caught.value.format() and errors[0].message


def test_all_errors_of_one_command_are_reported_together(dense):
    texts = ["optimizer.optimizer_offload_fraction=abc", "model.cpu_offload=True", "train.train_iters=x",
             "optimizer.optimizer_cpu_offload=maybe", "model.activation_offload_fraction=[3]"]
    with pytest.raises(OverrideErrors) as caught:
        apply_overrides(dense, texts + ["train.global_batch_size=16"])
    assert [e.text for e in caught.value.errors] == texts


def test_a_refusal_carries_the_copy_with_the_other_overrides_applied(dense):
    before = copy.deepcopy(dense)
    with pytest.raises(OverrideErrors) as caught:
        apply_overrides(dense, ["train.train_iters=x", "train.global_batch_size=16", "model.cpu_offload=True",
                                "model.cpu_offloading=True"])
    applied = caught.value.applied
    assert applied is not dense
    assert applied.train.global_batch_size == 16 and applied.model.cpu_offloading is True
    assert applied.train.train_iters == dense.train.train_iters
    assert config_diff(before, dense) == []


OUT_OF_RANGE = {  # override -> the rule of the table (facts/key_ranges.py) that refuses it, on the final values
    "optimizer.optimizer_offload_fraction=1.5": "optimizer-offload/fraction-range",
    "optimizer.optimizer_offload_fraction=-0.1": "optimizer-offload/fraction-range",
    "optimizer.optimizer_offload_fraction=100": "optimizer-offload/fraction-range",
    "model.activation_offload_fraction=1.01": "fine-grained/fraction-range",
    "model.activation_offload_fraction=-1": "fine-grained/fraction-range",
    "model.cpu_offloading_num_layers=-1": "activation-offload/num-layers-range",
    "model.cpu_offloading_num_layers=16": "activation-offload/num-layers-range",
    "model.min_offloaded_tensor_size=-1": "fine-grained/min-tensor-size",
    "model.offload_modules=[foo]": "fine-grained/modules-known",
    "model.offload_modules=[expert_fc2,moe_act]": "fine-grained/modules-known",
    "model.delta_offload_bytes_across_pp_ranks=-5": "fine-grained/pp-balance",
}


@pytest.mark.parametrize("text", sorted(OUT_OF_RANGE))
def test_a_value_out_of_range_is_applied_and_the_validator_names_key_value_range_and_fix(dense, text):
    cfg = apply_overrides(dense, [text])  # applicable: the override layer does not judge ranges
    key = text.split("=", 1)[0]
    problems = [p for p in validate(cfg, 1, environ={}, upstream=False).errors if p.rule_id == OUT_OF_RANGE[text]]
    assert len(problems) == 1, text
    problem = problems[0]
    assert problem.key == key and text.split("=", 1)[1].strip("[]").split(",")[0] in problem.value
    assert problem.rule and problem.fix.startswith(key + "=")


def test_values_are_converted_to_the_declared_type(dense):
    cfg = apply_overrides(dense, [
        "optimizer.optimizer_offload_fraction=1", "train.train_iters=1e3", "optimizer.lr=3e-5",
        "model.cpu_offloading=true", "optimizer.main_grads_dtype=bf16", "model.recompute_granularity=null",
        "model.offload_modules=[core_attn]", "checkpoint.save=/tmp/ckpt", "tokenizer.tokenizer_model=123",
        "optimizer.use_precision_aware_optimizer=True",
    ])
    assert cfg.optimizer.optimizer_offload_fraction == 1.0 and type(cfg.optimizer.optimizer_offload_fraction) is float
    assert cfg.train.train_iters == 1000 and type(cfg.train.train_iters) is int
    assert cfg.optimizer.lr == 3e-5 and cfg.model.cpu_offloading is True
    assert cfg.optimizer.main_grads_dtype is torch.bfloat16
    assert cfg.model.recompute_granularity is None and cfg.model.offload_modules == ["core_attn"]
    assert cfg.checkpoint.save == "/tmp/ckpt" and cfg.tokenizer.tokenizer_model == "123"


def test_input_is_never_mutated(dense):
    before = copy.deepcopy(dense)
    apply_overrides(dense, ["optimizer.optimizer_offload_fraction=0.7", "model.cpu_offloading=True",
                            "++env_vars.NVTE_CPU_OFFLOAD_V1=1", "~env_vars.NCCL_NVLS_ENABLE"])
    with pytest.raises(OverrideErrors):
        apply_overrides(dense, ["optimizer.lr=3", "train.train_iters=abc"])
    assert config_diff(before, dense) == []


def test_override_order_does_not_change_the_result(dense):
    texts = ["model.num_layers=8", "model.cpu_offloading_num_layers=7", "model.cpu_offloading=True",
             "optimizer.optimizer_offload_fraction=0.25", "optimizer.optimizer_cpu_offload=True"]
    forward = apply_overrides(dense, texts)
    backward = apply_overrides(dense, list(reversed(texts)))
    assert config_diff(forward, backward) == []


def test_range_check_reads_the_final_values_whatever_the_order(dense):
    # 12 layers offloaded is valid for 16 layers, invalid once num_layers=8, in any order of the overrides.
    for texts in (["model.num_layers=8", "model.cpu_offloading_num_layers=12"],
                  ["model.cpu_offloading_num_layers=12", "model.num_layers=8"]):
        cfg = apply_overrides(dense, texts)
        problems = [p for p in validate(cfg, 1, environ={}, upstream=False).errors
                    if p.rule_id == "activation-offload/num-layers-range"]
        assert [p.key for p in problems] == ["model.cpu_offloading_num_layers"]
        assert problems[0].value == "12 (model.num_layers=8)"
        assert "model.cpu_offloading_num_layers=7" in problems[0].fix


def test_did_you_mean_uses_real_field_names(dense):
    cases = {
        "optimizer.optimizer_offload_fractoin=0.5": "optimizer.optimizer_offload_fraction",
        "optimizer.offload_fraction=0.5": "optimizer.optimizer_offload_fraction",
        "model.optimizer_offload_fraction=0.5": "optimizer.optimizer_offload_fraction",
        "model.cpu_offloading_num_layer=2": "model.cpu_offloading_num_layers",
        "trian.train_iters=5": "train",
        "optimzer.lr=1e-4": "optimizer",
    }
    for text, expected in cases.items():
        with pytest.raises(OverrideErrors) as caught:
            apply_overrides(dense, [text])
        assert expected in caught.value.errors[0].fix, (text, caught.value.errors[0].fix)


def test_hydra_add_force_add_and_delete(dense):
    cfg = apply_overrides(dense, ["+env_vars.NVTE_CPU_OFFLOAD_V1=1", "~env_vars.NCCL_NVLS_ENABLE",
                                  "+comm_overlap.tp_comm_overlap=False", "~optimizer.lr",
                                  "++checkpoint.save=/tmp/x"])
    assert cfg.env_vars["NVTE_CPU_OFFLOAD_V1"] == 1 and "NCCL_NVLS_ENABLE" not in cfg.env_vars
    assert cfg.comm_overlap is not None and cfg.comm_overlap.tp_comm_overlap is False
    assert cfg.checkpoint.save == "/tmp/x"
    from megatron.bridge.training.config import OptimizerConfig

    assert cfg.optimizer.lr == OptimizerConfig.__dataclass_fields__["lr"].default
    with pytest.raises(OverrideErrors) as caught:
        apply_overrides(dense, ["+env_vars.NCCL_NVLS_ENABLE=1"])
    assert "already exists" in caught.value.errors[0].message
    with pytest.raises(OverrideErrors) as caught:
        apply_overrides(dense, ["comm_overlap.tp_comm_overlap=True"])
    assert caught.value.errors[0].fix == "create it and set the field: +comm_overlap.tp_comm_overlap=True"


def test_duplicate_keys_and_sweeps_are_refused(dense):
    with pytest.raises(OverrideErrors) as caught:
        apply_overrides(dense, ["optimizer.lr=1e-4", "optimizer.lr=2e-4", "optimizer.optimizer_offload_fraction=0,0.5"])
    messages = [e.message for e in caught.value.errors]
    assert "given twice" in messages[0] and "sweep" in messages[1]


def test_short_flags_expand_and_dotted_form_wins():
    values = {"tensor_parallel": 2, "global_batch_size": 64, "seq_length": 1024, "offload_fraction": 0.5}
    assert to_overrides(values, []) == [
        "model.tensor_model_parallel_size=2", "train.global_batch_size=64", "model.seq_length=1024",
        "dataset.seq_length=1024", "optimizer.optimizer_offload_fraction=0.5", "optimizer.optimizer_cpu_offload=True"]
    dotted = ["train.global_batch_size=8", "optimizer.optimizer_cpu_offload=False"]
    out = to_overrides(values, dotted)
    assert "train.global_batch_size=64" not in out and "optimizer.optimizer_cpu_offload=True" not in out
    assert "optimizer.optimizer_cpu_offload=False" in to_overrides({"offload_fraction": 0.0}, [])


def test_real_data_blend_as_the_readme_writes_it(dense):
    cfg = apply_overrides(dense, ["dataset.blend=[[/data/my_text_document],null]"])
    assert cfg.dataset.blend == (["/data/my_text_document"], None)
    with pytest.raises(OverrideErrors) as caught:
        apply_overrides(dense, ["dataset.blend=[[/data/a]]"])
    assert "2 items" in caught.value.errors[0].message


def test_given_keys_are_the_keys_a_command_line_gives_a_value():
    """What validation's Context.given_keys holds: each key as parsed ('+' / '++' dropped, short flags expanded first);
    a reset ('~key') asks for no value, so it is not a given key."""
    from overrides.grammar import given_keys

    typed = ["mixed_precision=bf16_with_fp8_current_scaling_mixed", "model.fp8_recipe=delayed", "+env_vars.A=1",
             "++checkpoint.save=/tmp/x", "~optimizer.lr", "~env_vars.B=2", *to_overrides({"tensor_parallel": 2}, [])]
    assert given_keys(typed) == {"mixed_precision", "model.fp8_recipe", "env_vars.A", "checkpoint.save",
                                 "model.tensor_model_parallel_size"}
    assert given_keys([]) == frozenset()
