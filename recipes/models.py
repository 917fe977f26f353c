"""Offline model definitions: Qwen3 providers built from published hyperparameters.

Upstream recipes call ``AutoBridge.from_hf_pretrained("Qwen/...")``, which needs the Hugging Face
hub. Here the same provider is built from a ``transformers`` config holding the numbers published in
each model's ``config.json``, so recipes build on machines without network access.
"""

from __future__ import annotations

from typing import Any

# Shared by every Qwen3 model (published config.json values).
_QWEN3_COMMON = dict(
    vocab_size=151936,
    head_dim=128,
    hidden_act="silu",
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    attention_bias=False,
    attention_dropout=0.0,
    torch_dtype="bfloat16",
    bos_token_id=151643,
    eos_token_id=151645,
)

# Dense Qwen3 sizes: name -> published hyperparameters.
QWEN3_DENSE: dict[str, dict[str, Any]] = {
    "0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True),
    "1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True),
    "4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
               num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
               num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False),
}

# Qwen3-30B-A3B: 48 layers, 128 routed experts, top-8 routing, no shared expert.
QWEN3_30B_A3B: dict[str, Any] = dict(
    hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
    num_attention_heads=32, num_key_value_heads=4, num_experts=128, num_experts_per_tok=8,
    decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, router_aux_loss_coef=0.001,
    output_router_logits=False, tie_word_embeddings=False,
)


def qwen3_dense_hf_config(size: str, num_layers: int | None = None):
    """``transformers.Qwen3Config`` of a published dense size, optionally with fewer layers."""
    from transformers import Qwen3Config

    if size not in QWEN3_DENSE:
        raise ValueError(f"unknown Qwen3 dense size {size!r}; known: {', '.join(QWEN3_DENSE)}")
    params = {**_QWEN3_COMMON, **QWEN3_DENSE[size]}
    if num_layers is not None:
        params["num_hidden_layers"] = num_layers
    return Qwen3Config(architectures=["Qwen3ForCausalLM"], **params)


def qwen3_30b_a3b_hf_config(num_layers: int | None = None):
    """``transformers.Qwen3MoeConfig`` of Qwen3-30B-A3B, optionally with fewer layers."""
    from transformers import Qwen3MoeConfig

    params = {**_QWEN3_COMMON, **QWEN3_30B_A3B}
    if num_layers is not None:
        params["num_hidden_layers"] = num_layers
    return Qwen3MoeConfig(architectures=["Qwen3MoeForCausalLM"], **params)


def provider_from_hf_config(hf_config):
    """Megatron model provider for an HF config, without weights and without the hub."""
    from megatron.bridge import AutoBridge

    return AutoBridge.from_hf_config(hf_config).to_megatron_provider(load_weights=False)
