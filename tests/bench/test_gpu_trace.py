"""The trace reader on a small hand-written Chrome trace (the format torch.profiler writes)."""

import gzip
import json

from mbridge_offload.bench.gpu_trace import gaps, load_events, load_launches, report, training_stream, union_us


def _event(name, cat, ts, dur, stream, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "tid": stream,
            "args": {"stream": stream, **args}}


def _trace(tmp_path):
    events = [
        _event("ProfilerStep#5", "gpu_user_annotation", 0, 10_000, 7),
        _event("gemm", "kernel", 0, 3_000, 7),
        _event("gemm", "kernel", 5_000, 5_000, 7),  # 2 ms idle before it
        _event("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 1_000, 2_000, 20, bytes=100_000_000),
        _event("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 2_000, 4_000, 21, bytes=100_000_000),
        _event("adam", "kernel", 3_500, 500, 22),
        {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 0, "dur": 10},
    ]
    path = tmp_path / "rank-0.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": events}, handle)
    return path


def test_a_step_annotated_on_several_streams_is_one_step(tmp_path):
    """Kineto writes a step's GPU annotation on each stream that ran work in it (the stream engine's copy streams
    too): the report divides the idle time by the steps, not by the annotations."""
    events = [_event("ProfilerStep#10", "gpu_user_annotation", 0, 10_000, 7),
              _event("ProfilerStep#10", "gpu_user_annotation", 500, 9_000, 20),
              _event("ProfilerStep#11", "gpu_user_annotation", 10_000, 10_000, 7),
              _event("ProfilerStep#11", "gpu_user_annotation", 9_800, 10_400, 20),
              _event("gemm", "kernel", 0, 4_000, 7), _event("gemm", "kernel", 6_000, 14_000, 7)]
    path = tmp_path / "rank-0.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": events}, handle)
    assert load_events(path)[1] == [(0.0, 10_000.0), (9_800.0, 20_200.0)]
    text = report(path, gap_ms=1.0)
    assert text.splitlines()[2].startswith("2 profiled step(s), 20.2 ms on the GPU")
    assert "2.0 ms over 1 gap(s) (1.0 ms per step)" in text


def test_union_counts_overlaps_once():
    assert union_us([(0, 4), (2, 6), (10, 11)]) == 7


def test_reads_streams_copies_and_gaps(tmp_path):
    events, steps = load_events(_trace(tmp_path))
    assert steps == [(0.0, 10_000.0)]
    assert training_stream(events) == 7
    assert gaps(events, 7, 1_000) == [(3_000.0, 5_000.0, "gemm", "gemm")]
    text = report(_trace(tmp_path), gap_ms=1.0)
    assert "HtoD 0.10 GB in 2.0 ms (50.0 GB/s)" in text
    assert "DtoH 0.10 GB in 4.0 ms (25.0 GB/s)" in text
    assert "2.0 ms over 1 gap(s)" in text
    assert "| 21: 2.0, 22: 0.5 |" in text  # what ran while the training stream waited (the HtoD ended before)


def _a_read_and_a_late_kernel() -> list[dict]:
    """Two gaps of the training stream (7): before a 4-byte DtoH launched by thread 1 at 5.9-6.0 ms (correlation 2),
    and before a kernel launched at 19.88-19.9 ms (correlation 3)."""
    return [
        _event("ProfilerStep#3", "gpu_user_annotation", 0, 30_000, 7),
        _event("gemm", "kernel", 0, 2_000, 7, correlation=1),
        _event("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 10_000, 10, 7, correlation=2, bytes=4),
        _event("gemm", "kernel", 20_000, 5_000, 7, correlation=3),
        {"ph": "X", "name": "cudaMemcpyAsync", "cat": "cuda_runtime", "ts": 5_900, "dur": 100, "tid": 1,
         "args": {"correlation": 2}},
        {"ph": "X", "name": "cudaLaunchKernel", "cat": "cuda_runtime", "ts": 19_880, "dur": 20, "tid": 1,
         "args": {"correlation": 3}},
    ]


def test_a_gap_says_when_and_by_what_the_work_after_it_was_launched(tmp_path):
    """Two gaps of the training stream: after the first, a copy the CPU had launched 4 ms before the gap ended (the
    GPU held it: an event or the copy engine's queue); after the second, a kernel launched 0.1 ms before (the CPU was
    late). The launching op is the innermost CPU op around the runtime call on its thread."""
    events = _a_read_and_a_late_kernel() + [
        {"ph": "X", "name": "aten::item", "cat": "cpu_op", "ts": 5_000, "dur": 6_000, "tid": 1},
        {"ph": "X", "name": "aten::_local_scalar_dense", "cat": "cpu_op", "ts": 5_800, "dur": 4_300, "tid": 1},
        {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 19_000, "dur": 1_000, "tid": 2},  # another thread
    ]
    path = tmp_path / "rank-0.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": events}, handle)
    launches = load_launches(path)
    assert launches[2].op == "aten::_local_scalar_dense" and launches[3].op == ""
    rows = {line.split(" | ")[1]: line for line in report(path, gap_ms=1.0).splitlines() if line.startswith("| ")
            and line.split(" | ")[1].replace(".", "").isdigit()}
    assert rows["8.00"].endswith("| 4.00 | aten::_local_scalar_dense (cudaMemcpyAsync) |")
    assert rows["9.99"].endswith("| 0.10 | cudaLaunchKernel |")


def test_a_launch_names_the_python_function_outside_torch_around_it(tmp_path):
    """With Python stacks in the trace, the gap's read names the innermost frame outside PyTorch around its launch
    on the launching thread: not a frame of PyTorch's own or a built-in, not a sibling that ended before it, not a
    frame of another thread. A launch with no such frame keeps only its op."""
    def frame(name, ts, dur, tid=1):
        return {"ph": "X", "name": name, "cat": "python_function", "ts": ts, "dur": dur, "tid": tid}

    events = _a_read_and_a_late_kernel() + [
        {"ph": "X", "name": "aten::_local_scalar_dense", "cat": "cpu_op", "ts": 5_800, "dur": 4_300, "tid": 1},
        frame("megatron/bridge/training/train.py(700): train", 0, 30_000),
        frame("megatron/bridge/training/train.py(300): training_log", 1_000, 1_000),  # ended before the read
        frame("mbridge_offload/runtime/metrics.py(222): on_train_step_end", 4_000, 7_000),
        frame("mbridge_offload/runtime/metrics.py(105): _loss_value", 5_500, 5_000),
        frame("<built-in method item of Tensor object at 0x7f>", 5_700, 4_500),
        frame("/usr/lib/python3/site-packages/torch/_tensor.py(40): wrapped", 5_750, 4_400),
        frame("other/thread.py(1): copy", 5_000, 2_000, tid=2),
    ]
    path = tmp_path / "rank-0.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": events}, handle)
    launches = load_launches(path)
    assert launches[2].caller == "mbridge_offload/runtime/metrics.py(105): _loss_value"
    assert launches[3].caller == "megatron/bridge/training/train.py(700): train"
    text = report(path, gap_ms=1.0)
    assert ("| 4.00 | aten::_local_scalar_dense (cudaMemcpyAsync) from "
            "mbridge_offload/runtime/metrics.py(105): _loss_value |") in text
    events = [e for e in events if e["cat"] != "python_function"]  # no stacks: no caller
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": events}, handle)
    assert load_launches(path)[2].caller == ""
