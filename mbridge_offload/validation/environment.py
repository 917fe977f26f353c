"""Rules of the environment: what a config needs installed (Transformer Engine, APEX, resiliency and
attention extensions), checked before a launch rather than failing inside it."""

from __future__ import annotations

from mbridge_offload.facts.key_ranges import fixed
from mbridge_offload.validation.activation_offload import activation_offload_on
from mbridge_offload.validation.fine_grained import fine_grained_on
from mbridge_offload.validation.guard import guarded
from mbridge_offload.validation.rule import ENVIRONMENT, Context, Rule


def _resiliency_features(ctx: Context) -> list[str]:
    cfg = ctx.cfg
    used = []
    if cfg.ft is not None:
        used.append("ft")
    if cfg.nvrx_straggler is not None:
        used.append("nvrx_straggler")
    if cfg.inprocess_restart is not None and getattr(cfg.inprocess_restart, "enabled", True):
        used.append("inprocess_restart")
    if getattr(cfg.checkpoint, "non_persistent_ckpt_type", None) == "local":
        used.append("checkpoint.non_persistent_ckpt_type=local")
    return used


RULES: tuple[Rule, ...] = guarded(
    Rule(id="env/transformer-engine", mechanism=ENVIRONMENT, key="model.transformer_impl",
         text="transformer_impl=transformer_engine (and every activation offload) needs Transformer Engine importable",
         applies=lambda c: (c.model.transformer_impl == "transformer_engine" or activation_offload_on(c)
                            or fine_grained_on(c)),
         holds=lambda c: c.installed_te is not None,
         fix=fixed("uv sync  (builds transformer-engine-torch once; see README 'Install')"),
         observed=lambda c: f"{c.model.transformer_impl} (Transformer Engine not importable)"),
    Rule(id="env/apex-gradient-accumulation-fusion", mechanism=ENVIRONMENT, key="model.gradient_accumulation_fusion",
         text="gradient_accumulation_fusion needs APEX's fused_weight_gradient_mlp_cuda, absent from a pip-installed "
              "stack",
         applies=lambda c: bool(getattr(c.model, "gradient_accumulation_fusion", False)),
         holds=lambda c: c.has_module("fused_weight_gradient_mlp_cuda"),
         fix=fixed("model.gradient_accumulation_fusion=False")),
    Rule(id="env/nvidia-resiliency-ext", mechanism=ENVIRONMENT, key="ft",
         text="fault tolerance, NVRx straggler detection, in-process restart and local checkpoints need "
              "nvidia-resiliency-ext, which is not installed (no wheel for this glibc)",
         applies=lambda c: bool(_resiliency_features(c)), holds=lambda c: c.has_module("nvidia_resiliency_ext"),
         fix=lambda c: " ".join(("checkpoint.non_persistent_ckpt_type=null" if f.startswith("checkpoint")
                                 else f"~{f}") for f in _resiliency_features(c)),
         observed=lambda c: "enabled: " + ", ".join(_resiliency_features(c)),
         fix_text="~ft / ~nvrx_straggler / ~inprocess_restart, or install nvidia-resiliency-ext"),
    # ConfigContainer.validate checks the flex dispatcher's backend against the GPU it runs on; the validator skips
    # that check where there is no CUDA device (upstream.py): the report says what was not checked.
    Rule(id="env/flex-dispatcher-gpu-unchecked", mechanism=ENVIRONMENT, key="model.moe_flex_dispatcher_backend",
         text="with moe_token_dispatcher_type=flex, Megatron Bridge checks the dispatcher backend (DeepEP: Ampere, "
              "Hopper, B200/B300; HybridEP: Ampere to Blackwell; NCCL EP: Hopper, Blackwell) against the GPU: not "
              "checked here, where there is no CUDA device; the launch on the GPUs checks it",
         applies=lambda c: getattr(c.model, "moe_token_dispatcher_type", None) == "flex" and not c.has_cuda(),
         holds=lambda c: False,
         observed=lambda c: (f"{c.model.moe_flex_dispatcher_backend} (moe_token_dispatcher_type=flex; not checked "
                             "against a GPU: no CUDA device here)"),
         fix=fixed("nothing to change here; to check it before a long run, validate on a GPU node "
                   "(run_recipe.py --dry-run there)"), severity="warning"),
    Rule(id="env/fast-hadamard-transform", mechanism=ENVIRONMENT, key="model.experimental_attention_variant",
         text="DeepSeek sparse attention (dsa) needs fast-hadamard-transform, which is not installed "
              "(needs its own CUDA build)",
         applies=lambda c: getattr(c.model, "experimental_attention_variant", None) == "dsa",
         holds=lambda c: c.has_module("fast_hadamard_transform"),
         fix=fixed("model.experimental_attention_variant=null")),
)
