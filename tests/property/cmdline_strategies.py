"""Hypothesis strategies for command lines: override keys and values at the edges, malformed syntax."""

from __future__ import annotations

from hypothesis import strategies as st

SEED = "qwen3_30b_a3b_pretrain_config"  # the seed's recipe: MoE, TP2 PP2 EP4 on 16 GPUs
DENSE = "qwen3_1b_proxy_pretrain_config"  # a dense one-GPU recipe

# The keys the rules and the planner divide by, count over or compare: the ones most likely to break them.
HOT_KEYS = (
    "model.tensor_model_parallel_size", "model.pipeline_model_parallel_size", "model.context_parallel_size",
    "model.expert_model_parallel_size", "model.expert_tensor_parallel_size", "model.num_layers",
    "model.num_attention_heads", "model.num_query_groups", "model.num_moe_experts", "model.hidden_size",
    "model.ffn_hidden_size", "model.kv_channels", "model.seq_length", "dataset.seq_length",
    "train.global_batch_size", "train.micro_batch_size", "train.train_iters",
    "optimizer.optimizer_offload_fraction", "optimizer.optimizer_cpu_offload", "model.cpu_offloading",
    "model.cpu_offloading_num_layers", "model.fine_grained_activation_offloading", "model.offload_modules",
    "model.activation_offload_fraction", "model.min_offloaded_tensor_size", "model.recompute_granularity",
    "model.moe_router_topk", "model.vocab_size", "model.deterministic_mode", "checkpoint.load",
)

EDGE_INTS = (0, -1, 1, 2, 3, 7, -(2**31), 2**31, 2**63, 10**30, -(10**30))
EDGE_FLOATS = ("0.0", "-0.0", "1.5", "-0.5", "1e308", "1e-308", "nan", "inf", "-inf", "0.999999", "1.0000001")
WORDS = ("null", "None", "True", "False", "true", "auto", "abc", "[]", "[a,b]", "[expert_fc1,moe_act]", "{a:1}",
         "'quoted value'", "\"x\"", "[1,2,3]", "1,2", "selective", "full", "transformer_engine", "fp16", "")
# Text that is not valid override syntax, or barely is.
GARBAGE = st.text(alphabet="abc.=+~[]{}(),:'\"\\ 0129-_@$%*", max_size=12)


def override_values() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(EDGE_INTS).map(str),
        st.integers(min_value=-(2**70), max_value=2**70).map(str),
        st.sampled_from(EDGE_FLOATS),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.sampled_from(WORDS),
        GARBAGE,
    )


def override_texts(keys: list[str]) -> st.SearchStrategy[str]:
    """One override as a user might type it: a real key (mostly the hot ones), a form, a value."""
    key = st.one_of(st.sampled_from(HOT_KEYS), st.sampled_from(keys),
                    st.sampled_from(keys).map(lambda k: k[:-1] if len(k) > 3 else k + "x"))  # a typo
    form = st.sampled_from(("{k}={v}", "{k}={v}", "{k}={v}", "+{k}={v}", "++{k}={v}", "~{k}", "{k}", "{k}=={v}"))
    return st.one_of(
        st.builds(lambda f, k, v: f.format(k=k, v=v), form, key, override_values()),
        GARBAGE,
    )


SHORT_FLAGS = ("-tp", "-pp", "-cp", "-ep", "-gb", "-mb", "-ti", "-sl", "-of")


def short_flag_args() -> st.SearchStrategy[list[str]]:
    pair = st.tuples(st.sampled_from(SHORT_FLAGS), override_values())
    return st.lists(pair, max_size=3).map(lambda pairs: [x for p in pairs for x in p])
