"""The streaming offload engine's parts that run without a GPU: the order its worker takes the chunks in,
the recipe transform that selects it, and the header line a run prints. The engine's training runs are
GPU tests (tests/runtime/test_gpu_engine.py) and docs/benchmarks/offload-engine/."""

from __future__ import annotations

import pytest

from mbridge_offload.facts.offload_engine import DEFAULT_ENGINE, ENGINE_MODES, engine_mode
from mbridge_offload.runtime.streaming_engine import install, processing_order
from mbridge_offload.facts.offload_engine import stream_chunk_numel as chunk_numel, stream_ring_bytes as ring_bytes
from mbridge_offload.runtime.streamed_states import chunk_layout
from mbridge_offload.facts.offload_engine import last_used_first


def test_worker_takes_chunks_in_first_forward_use_then_highest_first():
    # the forward met chunk 7 (first layers) first, then 5; 6 and the rest it never used
    assert processing_order([7, 5, 7, 9], 8) == [7, 5, 6, 4, 3, 2, 1, 0]
    assert processing_order([], 3) == [2, 1, 0]  # before any forward: the library's buffers run backwards


def test_the_shell_wins_over_the_config_and_the_default_is_the_library():
    assert engine_mode({}, {}) == DEFAULT_ENGINE == "library"
    assert engine_mode({"MBRIDGE_OFFLOAD_ENGINE": "exact"}, {}) == "exact"
    assert engine_mode({"MBRIDGE_OFFLOAD_ENGINE": "exact"}, {"MBRIDGE_OFFLOAD_ENGINE": "delayed"}) == "delayed"
    assert engine_mode({"MBRIDGE_OFFLOAD_ENGINE": "fast"}, {}) == "fast"  # the validator names it


def test_recipe_transform_selects_the_engine_and_refuses_an_unknown_one(recipe):
    from recipes import with_offload_engine, with_optimizer_offload

    base = with_optimizer_offload(recipe("qwen3_1b_proxy_pretrain_config"), fraction=1.0, overlap=True)
    cfg = with_offload_engine(base, "delayed")
    assert cfg.env_vars["MBRIDGE_OFFLOAD_ENGINE"] == "delayed" and "MBRIDGE_OFFLOAD_ENGINE" not in base.env_vars
    with pytest.raises(ValueError, match="one of library, exact, stream, delayed"):
        with_offload_engine(base, "fastest")


def test_recipe_transform_sets_the_stream_moments_and_refuses_an_unknown_dtype(recipe):
    from mbridge_offload.facts.offload_engine import stream_moments
    from recipes import with_offload_engine, with_stream_moments

    base = with_offload_engine(recipe("qwen3_1b_proxy_pretrain_config"), "stream")
    cfg = with_stream_moments(base, "bf16")
    assert stream_moments(cfg.env_vars, {}) == "bf16" and stream_moments(base.env_vars, {}) == "fp32"
    assert stream_moments(cfg.env_vars, {"MBRIDGE_OFFLOAD_STREAM_MOMENTS": "fp32"}) == "fp32"  # the shell wins
    for wrong in ("BF16", "bfloat16", 2):
        with pytest.raises(ValueError, match="one of fp32, bf16"):
            with_stream_moments(base, wrong)


def test_install_refuses_an_unknown_mode_and_the_library_changes_nothing():
    with pytest.raises(ValueError, match="unknown offload engine 'fast'"):
        install("fast")
    from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer

    step = HybridDeviceOptimizer.step
    install("library")
    assert HybridDeviceOptimizer.step is step


def test_run_header_says_which_engine_runs_and_what_it_guarantees(recipe, tmp_path, monkeypatch):
    from overrides import apply_overrides
    from recipes import with_offload_engine, with_optimizer_offload
    from mbridge_offload.runtime.launch import LaunchSettings, run_header

    cfg = with_offload_engine(with_optimizer_offload(recipe("qwen3_1b_proxy_pretrain_config"), 1.0, True), "exact")
    settings = LaunchSettings(recipe_name="r", num_gpus=1, out_dir=tmp_path, cpu_threads="auto", tuning_lines=(),
                              run_lines=(), overlap_chunks=8, topology="1 GPU", offload_lines=())
    monkeypatch.delenv("MBRIDGE_OFFLOAD_COPY_PIECES_IN_FLIGHT", raising=False)
    header = run_header(cfg, settings, "test")
    assert f"offload engine: exact: {ENGINE_MODES['exact']}" in header
    assert "bit-identical in deterministic mode" in header
    assert "in flight" not in header  # the default window is not a setting to report
    one_piece = apply_overrides(cfg, ["++env_vars.MBRIDGE_OFFLOAD_COPY_PIECES_IN_FLIGHT=1"])
    assert ("copies: 1 piece(s) in flight (MBRIDGE_OFFLOAD_COPY_PIECES_IN_FLIGHT; 2 by default)"
            in run_header(one_piece, settings, "test"))


def test_diagnose_reads_the_allocator_setting_the_run_header_names(recipe, tmp_path, monkeypatch):
    from overrides import apply_overrides
    from mbridge_offload.diagnosis.logs import read_lines
    from mbridge_offload.diagnosis.run_facts import run_facts
    from mbridge_offload.runtime.launch import LaunchSettings, run_header

    settings = LaunchSettings(recipe_name="r", num_gpus=1, out_dir=tmp_path, cpu_threads="auto", tuning_lines=(),
                              run_lines=(), overlap_chunks=8, topology="1 GPU", offload_lines=())
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    cfg = recipe("qwen3_1b_proxy_pretrain_config")  # the recipe's expandable segments
    off = apply_overrides(cfg, ["++env_vars.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False"])
    unset = apply_overrides(cfg, ["~env_vars.PYTORCH_CUDA_ALLOC_CONF"])
    for i, (config, shell, expandable) in enumerate([(cfg, {}, True), (off, {}, False), (unset, {}, False),
                                                     (unset, {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, True),
                                                     (cfg, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"},
                                                      False)]):
        for name, value in shell.items():
            monkeypatch.setenv(name, value)
        log = tmp_path / f"{i}.log"
        log.write_text(run_header(config, settings, "test") + "\n")
        assert run_facts(read_lines(log), None).expandable_segments is expandable, (i, log.read_text())
        for name in shell:
            monkeypatch.delenv(name)


@pytest.mark.parametrize("sizes,numel", [([10, 3, 7], 4), ([5], 5), ([1, 1, 1, 1], 3), ([17, 2, 40, 1, 9], 11),
                                         ([6, 6], 100)])
def test_stream_layout_cuts_the_tensors_into_chunks_that_cover_every_element_once(sizes, numel):
    chunks = chunk_layout(sizes, numel)
    total = sum(sizes)
    assert [c.start for c in chunks] == list(range(0, total, numel)) and chunks[-1].stop == total
    covered = {i: [] for i in range(len(sizes))}
    for chunk in chunks:
        assert chunk.stop - chunk.start <= numel
        offset = 0
        for piece in chunk.pieces:  # in the chunk, pieces lie end to end in tensor order
            assert piece.slot_offset == offset and piece.stop > piece.start
            offset += piece.stop - piece.start
            covered[piece.tensor].append((piece.start, piece.stop))
        assert offset == chunk.stop - chunk.start
    for tensor, ranges in covered.items():
        # each tensor's pieces are consecutive, from 0 to its size: a tensor may span chunks, never overlap
        assert ranges[0][0] == 0 and ranges[-1][1] == sizes[tensor]
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


@pytest.mark.parametrize("fraction", [0, 0.1, 0.25, 0.5, 0.75, 1])
def test_stream_offloads_the_tensors_the_forward_uses_last_by_the_librarys_threshold(fraction):
    # a tied embedding (used first) as large as a quarter of the model, then 16 layers of 7 tensors, shuffled
    import random

    rng = random.Random(7)
    sizes = [311] + [rng.choice([1, 6, 12, 20]) for _ in range(16 * 7)]
    positions = list(range(len(sizes)))
    order = list(range(len(sizes)))
    rng.shuffle(order)
    sizes, positions = [sizes[i] for i in order], [positions[i] for i in order]
    chosen = last_used_first(sizes, positions, fraction)
    threshold = sum(sizes) * fraction
    total = sum(sizes[i] for i in chosen)
    # the library's rule: offload while the total offloaded is below the threshold, so at least the threshold and
    # less than it before the last one
    assert total >= threshold and (not chosen or total - sizes[chosen[-1]] < threshold)
    # and the ones taken are the last the forward uses: every one after the first taken is taken
    first_taken = min((positions[i] for i in chosen), default=len(sizes))
    assert {positions[i] for i in chosen} == set(range(first_taken, len(sizes)))
    assert (0 in {positions[i] for i in chosen}) == (fraction == 1)  # the embedding stays until everything goes


def test_stream_ring_holds_three_chunks_of_both_moments():
    params = 1_100_000_000
    numel = chunk_numel(params)
    assert numel == -(-params // 32)
    assert ring_bytes(params) == 3 * 2 * 4 * numel  # ~9.4% of the 8 bytes per parameter the host holds
    small = 3_000_000  # chunks are at least 2**20 elements: 3 chunks, all in the ring
    assert chunk_numel(small) == 1 << 20 and ring_bytes(small) == 3 * 8 * (1 << 20)
    assert ring_bytes(500) == 8 * 500 and ring_bytes(0) == 0


@pytest.mark.parametrize("chunks, modules", [(32, 64), (32, 75), (32, 20), (32, 0), (1, 5), (7, 7)])
def test_stream_spreads_its_enqueueing_over_the_modules_before_the_first_offloaded_one(chunks, modules):
    from mbridge_offload.facts.offload_engine import stream_pacing

    calls_per_enqueue, chunks_per_enqueue = stream_pacing(chunks, modules)
    enqueues_before_the_gate = max(1, modules) // calls_per_enqueue
    assert enqueues_before_the_gate * chunks_per_enqueue >= chunks  # all enqueued by the first offloaded module
    if modules >= chunks:  # one chunk at a time, as far apart as the modules allow
        assert chunks_per_enqueue == 1 and (calls_per_enqueue + 1) * chunks > modules


def test_stream_rules_need_adam_and_not_the_library_overlap_streams(recipe):
    from recipes import with_offload_engine, with_optimizer_offload
    from mbridge_offload.validation import validate

    base = with_offload_engine(with_optimizer_offload(recipe("qwen3_1b_proxy_pretrain_config"), 1.0, False), "stream")
    ids = {p.rule_id for p in validate(base, num_gpus=1, environ={}).problems}
    assert "offload-engine/needs-overlap-streams" not in ids and "offload-engine/stream-adam" not in ids
    base.optimizer.optimizer = "sgd"
    problems = [p for p in validate(base, num_gpus=1, environ={}).problems if p.rule_id == "offload-engine/stream-adam"]
    assert problems and "optimizer.optimizer=adam" in problems[0].fix
    exact = with_offload_engine(with_optimizer_offload(recipe("qwen3_1b_proxy_pretrain_config"), 1.0, False), "exact")
    assert "offload-engine/needs-overlap-streams" in {p.rule_id for p in validate(exact, num_gpus=1, environ={}).problems}


def test_stream_host_buffer_is_zeroed_and_left_out_of_forked_processes():
    """Linux copies DMA-pinned pages into a forked child: the stream engine's moments must not follow the data
    loader's workers (measured on the H200: two workers tripled the moments' host memory)."""
    import os

    from mbridge_offload.runtime.streamed_states import host_buffer

    assert host_buffer(0).numel() == 0  # an optimizer with nothing offloaded
    buffer = host_buffer(1 << 20)
    assert buffer.numel() == 1 << 20 and not buffer.any()
    buffer.fill_(3.0)
    start = buffer.data_ptr()

    def mapped(pid: str) -> bool:
        for line in open(f"/proc/{pid}/maps"):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= start < hi:
                return True
        return False

    assert mapped("self")
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child reports whether it has the mapping, without touching it
        os.write(write, b"1" if mapped("self") else b"0")
        os._exit(0)
    os.waitpid(child, 0)
    assert os.read(read, 1) == b"0"
    assert float(buffer[-1]) == 3.0  # the parent keeps it


def test_stream_moves_host_copies_into_one_buffer_keeping_the_tensors_and_their_values():
    import torch

    from mbridge_offload.runtime.streamed_states import host_buffer, move_into

    copies = [torch.arange(n, dtype=torch.float32) + n for n in (5, 300, 17, 1000)]
    before = [c.clone() for c in copies]
    ids = [id(c) for c in copies]
    flat = host_buffer(sum(c.numel() for c in copies))
    releases = []
    assert move_into(copies, flat, lambda: releases.append(1), release_every=4 * 600) == flat.numel()
    offset = 0
    for copy, old, ident in zip(copies, before, ids):
        # the same tensor objects (the optimizers and the checkpoint hold them), now views of the buffer
        assert id(copy) == ident and torch.equal(copy, old)
        assert copy.data_ptr() == flat[offset:].data_ptr()
        offset += copy.numel()
    assert len(releases) == 2  # once past 600 elements moved, and at the end
    flat.zero_()
    assert all(not c.any() for c in copies)
    assert move_into(copies, flat, lambda: releases.append(1)) == flat.numel() and len(releases) == 3  # nothing moves


def test_a_bucket_groups_all_gather_waits_for_the_chunks_holding_its_offloaded_shards():
    from mbridge_offload.runtime.streamed_states import chunks_of

    # a tensor may span two chunks; a parameter kept on the GPU optimizer has none
    chunk_of_model = {"qkv": (3, 4), "proj": (4,), "norm": (5,)}
    assert chunks_of({"proj", "qkv", "bias-on-gpu"}, chunk_of_model) == (3, 4)
    assert chunks_of({"bias-on-gpu"}, chunk_of_model) == ()


def test_the_delayed_engines_header_gives_the_deviation_its_recorded_run_measured():
    """The header's figures for the delayed engine are those of the committed parity runs (50 steps against no
    offload): its largest loss deviation and the deviation at the last step."""
    from pathlib import Path

    from mbridge_offload.bench.resume_parity import steps_by_iteration

    parity = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "offload-engine" / "parity"
    delayed, baseline = steps_by_iteration(parity / "delayed-1"), steps_by_iteration(parity / "baseline")
    deltas = {i: abs(delayed[i]["loss"] - baseline[i]["loss"]) for i in baseline}
    last = max(deltas)
    assert last == 50
    text = ENGINE_MODES["delayed"]
    assert f"by up to {max(deltas.values()):.2f} " in text and f"by {deltas[last]:.3f} at step {last}" in text
