"""Which engine runs the offloaded optimizer step, and what each one guarantees.

The engine is chosen by one environment variable, so that a recipe (``env_vars``), an override
(``+env_vars.MBRIDGE_OFFLOAD_ENGINE=exact``), ``run_recipe.py --offload-engine`` and the shell all name the
same thing, and the checkpoint's saved config records it. The shell wins over ``env_vars``, as for every
variable a run reads.
"""

from __future__ import annotations

import math
from typing import Mapping

from mbridge_offload.facts.environment import run_env

def _stripped_setting(name: str, env_vars: Mapping[str, object] | None, environ: Mapping[str, str]) -> str | None:
    """The variable ``name`` as a run sees it (the shell's, else the config's), stripped, or None where unset."""
    value = run_env(name, env_vars, environ)
    return None if value is None else value.strip()


ENGINE_ENV = "MBRIDGE_OFFLOAD_ENGINE"
ENGINE_KEY = f"env_vars.{ENGINE_ENV}"
LIBRARY = "library"
EXACT = "exact"
DELAYED = "delayed"
STREAM = "stream"
DEFAULT_ENGINE = LIBRARY
# mode: what it does and what it guarantees, in the words of the run's header
ENGINE_MODES = {
    LIBRARY: "Megatron Core's HybridDeviceOptimizer step: the CPU Adam runs after backward, before the next "
             "step starts (exact)",
    EXACT: "the CPU Adam of step k runs while step k+1's forward starts; each layer's forward waits only for "
           "its own parameters' update (the same update as the library's path: bit-identical in "
           "deterministic mode, measured over 50 steps on one GPU)",
    STREAM: "Adam's moments stay on the host and stream through the GPU chunk by chunk, where the GPU optimizer "
            "without offload updates them during the next step's forward; each layer's forward waits only for its "
            "own parameters, and the offloaded ones are those the forward uses last (the same update as without "
            "offload: bit-identical in deterministic mode, measured over 50 steps on one GPU, on the dense 1.1B "
            "proxy at fractions 1 and 0.25 and on the 4-layer MoE proxy at fraction 1; the CPU runs no Adam)",
    DELAYED: "one-step delayed parameter update (ZeRO-Offload's DPU): step k's CPU Adam runs during step k+1, "
             "whose forward and backward use the offloaded parameters before it (those kept on the GPU update in "
             "their step); gradient clipping stays exact; NOT the "
             "same training as without offload: on the 1.1B proxy (mock data, 50 steps) its loss trailed no "
             "offload's by up to 3.73 while the loss fell fastest and by 0.081 at step 50 "
             "(docs/benchmarks/offload-engine/parity/)",
}


def engine_mode(env_vars: Mapping[str, object] | None, environ: Mapping[str, str]) -> str:
    """The engine a run will use: the shell's MBRIDGE_OFFLOAD_ENGINE, else the config's, else the default.
    Unknown values come back as given (the validator names them)."""
    value = run_env(ENGINE_ENV, env_vars, environ)
    return DEFAULT_ENGINE if value is None else value


# The exact and delayed engines' threads by the names their WORKER_STOPPED message (engine_messages.py) gives them: the
# worker (the CPU Adam), the thread that copies the gradients to the host, the one that copies the updated weights back
WORKER_THREAD, GRADIENT_COPY_THREAD, WEIGHT_COPY_THREAD = "worker", "gradient copy", "weight copy"
ENGINE_THREADS = (WORKER_THREAD, GRADIENT_COPY_THREAD, WEIGHT_COPY_THREAD)


# The exact and delayed modes' copies in pieces (mbridge_offload/runtime/copy_pieces.py): how many pieces each copy
# thread keeps enqueued and unfinished. Two is what ran on a GPU (docs/benchmarks/offload-engine/copy-pieces/); one
# leaves the copy engine's queue empty after each piece, for a copy of another stream to get in, at the cost of the
# interpreter's lock after each piece. A setting to compare them (bench_offload's -one-piece configurations).
COPY_WINDOW_ENV = "MBRIDGE_OFFLOAD_COPY_PIECES_IN_FLIGHT"
COPY_WINDOW_KEY = f"env_vars.{COPY_WINDOW_ENV}"
DEFAULT_COPY_WINDOW = 2
COPY_WINDOWS = range(1, 5)  # more than a few in flight is the copy enqueued at once again
COPY_WINDOW_KNOWN_FIX = (f"++{COPY_WINDOW_KEY}=1  (or 2, the default, up to {COPY_WINDOWS[-1]}; a value in the shell "
                         "wins: set it there)")


def copy_window_setting(env_vars: Mapping[str, object] | None, environ: Mapping[str, str]) -> str | None:
    """MBRIDGE_OFFLOAD_COPY_PIECES_IN_FLIGHT as a run sees it (the shell's, else the config's), or None where unset."""
    return _stripped_setting(COPY_WINDOW_ENV, env_vars, environ)


def copy_window_known(value: str) -> bool:
    """Whether a setting of MBRIDGE_OFFLOAD_COPY_PIECES_IN_FLIGHT is a whole number in COPY_WINDOWS."""
    return value.isdigit() and int(value) in COPY_WINDOWS


def _whole_number(name: str, value: str, known: bool, says: str, low: int, high: int, fix: str) -> int:
    """``value`` of the variable ``name`` as an int, or the ValueError that names it, the range and ``fix`` (the
    validator refuses it before the launch with the same fix): ``says`` what the number is ("the pieces in flight
    are")."""
    if not known:
        raise ValueError(f"{name}={value!r}: {says} a whole number from {low} to {high}. Fix: {fix}")
    return int(value)


def copy_window(env_vars: Mapping[str, object] | None, environ: Mapping[str, str]) -> int:
    """The pieces each copy thread keeps in flight: the setting, else the default; ValueError for one that is not
    ``copy_window_known``."""
    value = copy_window_setting(env_vars, environ)
    if value is None:
        return DEFAULT_COPY_WINDOW
    return _whole_number(COPY_WINDOW_ENV, value, copy_window_known(value), "the pieces in flight are", COPY_WINDOWS[0],
                         COPY_WINDOWS[-1], COPY_WINDOW_KNOWN_FIX)


# The exact and delayed modes' copies with a GPU-side pause between their pieces instead of a window
# (mbridge_offload/runtime/copy_pieces.py): every piece enqueued at once, each after a pause of about this many
# microseconds on the copy's stream, so that another stream's small copy in the same direction (a step's read) gets in
# between pieces without the copy thread having to wake. In plain torch on one H100 a pause asked for 20 us let the
# reads through as one piece in flight did, the copy at full rate (docs/benchmarks/offload-engine/d2h-by-kernel/).
COPY_PAUSE_ENV = "MBRIDGE_OFFLOAD_COPY_PIECE_PAUSE_US"
COPY_PAUSE_KEY = f"env_vars.{COPY_PAUSE_ENV}"
COPY_PAUSE_RANGE_US = (1, 1000)  # a pause longer than a 128 MiB piece's copy (~2.4 ms) would halve the copy's rate
COPY_PAUSE_KNOWN_FIX = (f"++{COPY_PAUSE_KEY}=20  (a whole number of microseconds from {COPY_PAUSE_RANGE_US[0]} to "
                        f"{COPY_PAUSE_RANGE_US[1]}; unset: pieces in a window, the default; a value in the shell wins: "
                        "set it there)")


def copy_pause_setting(env_vars: Mapping[str, object] | None, environ: Mapping[str, str]) -> str | None:
    """MBRIDGE_OFFLOAD_COPY_PIECE_PAUSE_US as a run sees it (the shell's, else the config's), or None where unset."""
    return _stripped_setting(COPY_PAUSE_ENV, env_vars, environ)


def copy_pause_known(value: str) -> bool:
    return value.isdigit() and COPY_PAUSE_RANGE_US[0] <= int(value) <= COPY_PAUSE_RANGE_US[1]


def copy_pause_us(env_vars: Mapping[str, object] | None, environ: Mapping[str, str]) -> int | None:
    """The pause before each piece in microseconds, or None (pieces in a window); ValueError for a setting that is
    not ``copy_pause_known``."""
    value = copy_pause_setting(env_vars, environ)
    if value is None:
        return None
    return _whole_number(COPY_PAUSE_ENV, value, copy_pause_known(value), "the pause before each piece in microseconds "
                         "is", *COPY_PAUSE_RANGE_US, COPY_PAUSE_KNOWN_FIX)


# The exact and delayed modes' zeroing of the gradient buffers by region (mbridge_offload/runtime/grad_regions.py,
# docs/design/streaming-offload-engine.md section 12): each region zeroed after the copies that read it, the backward
# waiting per region before it first writes there, instead of the whole buffer after the whole D2H. Opt-in: built and
# run on the CPU stand-in, not yet on a GPU.
ZERO_BY_REGION_ENV = "MBRIDGE_OFFLOAD_ZERO_BY_REGION"
ZERO_BY_REGION_KEY = f"env_vars.{ZERO_BY_REGION_ENV}"
ZERO_BY_REGION_VALUES = ("on", "off")
REGION_BYTES = 128 * 2**20  # a region's size before it is cut at a parameter's start (a bucket's bounds cut too)
ZERO_BY_REGION_HEADER = f"zeroing by region: on ({ZERO_BY_REGION_ENV})"
ZERO_BY_REGION_SAYS = ("each gradient buffer is zeroed region by region after the copies that read it, and the "
                       "backward waits per region before its first write there, not for the whole copy to the host; "
                       "the same memsets of the same memory (the delayed mode also copies in the order the backward "
                       "writes). Measured on one H100: no update changed, no step-time gain (the validator's "
                       "zero-by-region-no-gain warning has the figures); compare the step time with it off on your "
                       "model")


def zero_by_region_setting(env_vars: Mapping[str, object] | None, environ: Mapping[str, str]) -> str | None:
    """MBRIDGE_OFFLOAD_ZERO_BY_REGION as a run sees it (the shell's, else the config's), or None where unset."""
    return _stripped_setting(ZERO_BY_REGION_ENV, env_vars, environ)


def zero_by_region_on(env_vars: Mapping[str, object] | None, environ: Mapping[str, str]) -> bool:
    return zero_by_region_setting(env_vars, environ) == "on"


# When the delayed mode hands a step's gradient copies to its copy thread (docs/design/streaming-offload-engine.md
# sections 15-16): in the optimizer step, or at the next step's gradient zeroing. A read the training stream makes
# after the step (the loss, the gradient norm) waits on the copy engine for the rest of the gradients' D2H; started at
# the next step, the D2H finds those reads done and runs under the next forward (delayed-read-fixes/'s profile). The delayed update has until the next
# step's optimizer step, so its CPU Adam starts later within the time it already has. The exact mode's next forward
# waits for its update: it cannot start its copies later.
DELAYED_COPY_START_ENV = "MBRIDGE_OFFLOAD_DELAYED_COPY_START"
DELAYED_COPY_START_KEY = f"env_vars.{DELAYED_COPY_START_ENV}"
COPY_AT_STEP, COPY_AT_NEXT_STEP = "step", "next-step"
DELAYED_COPY_STARTS = (COPY_AT_STEP, COPY_AT_NEXT_STEP)
DELAYED_COPY_START_KNOWN_FIX = (f"++{DELAYED_COPY_START_KEY}={COPY_AT_NEXT_STEP}  (or {COPY_AT_STEP}, the default; a "
                                "value in the shell wins: set it there)")
DELAYED_COPY_START_HEADER = f"gradient copies: from the next step's gradient zeroing ({DELAYED_COPY_START_ENV})"
# What the delayed mode's two read fixes (copies from the next step, spaced pieces) measured on GPUs
# (docs/benchmarks/offload-engine/delayed-read-fixes/): both rules' warnings say READ_FIXES_MEASURED, the run's header
# line for copies from the next step READ_FIXES_TOGETHER
READ_FIXES_TOGETHER = (
    "together, copies from the next step's zeroing and spaced pieces took the delayed mode on the dense proxy at "
    "fraction 1 from 1.29x its baseline's step time to 1.25x, with the same loss and peak memory (one quiet H100, 3 "
    "interleaved rounds, lower in each round: docs/benchmarks/offload-engine/delayed-read-fixes/)")
READ_FIXES_MEASURED = (
    f"{READ_FIXES_TOGETHER}; neither alone is sized: on a noisy H100 (its baseline's steps varied 7.4-7.6 %) each "
    "ran after the delayed mode without it in each of 3 rounds, while the host sped up")
DELAYED_COPY_START_SAYS = ("each step's gradients are copied to the host from the next step's gradient zeroing, after "
                           "the step's reads of the loss and norms and, on a logged step, Megatron's timer's "
                           "device-wide synchronize; the same update (the copies' values and the CPU Adam are "
                           "unchanged, only when the copies start); the gradients they read are held until then; "
                           f"{READ_FIXES_TOGETHER}")


def delayed_copy_start_setting(env_vars: Mapping[str, object] | None, environ: Mapping[str, str]) -> str | None:
    """MBRIDGE_OFFLOAD_DELAYED_COPY_START as a run sees it (the shell's, else the config's), or None where unset.
    Other values come back as given (the validator names them)."""
    return _stripped_setting(DELAYED_COPY_START_ENV, env_vars, environ)


def copies_at_next_step(env_vars: Mapping[str, object] | None, environ: Mapping[str, str]) -> bool:
    return delayed_copy_start_setting(env_vars, environ) == COPY_AT_NEXT_STEP


# The stream mode's fetch-ahead (mbridge_offload/runtime/fetch_ahead.py): the next update's chunks after the ring's come
# up during the backward, into memory it has freed. Opt-in: on one H100 and the 4-layer MoE proxy it kept the update and
# the peak allocated but added its buffers to the reserved memory, with no step-time gain resolved
# (docs/benchmarks/offload-engine/stream-fetch-ahead/).
FETCH_AHEAD_ENV = "MBRIDGE_OFFLOAD_STREAM_FETCH_AHEAD"
FETCH_AHEAD_KEY = f"env_vars.{FETCH_AHEAD_ENV}"
FETCH_AHEAD_VALUES = ("on", "off")
# the run's header line that says it is on (diagnose reads it), and what the line says of it
FETCH_AHEAD_HEADER = f"fetch-ahead: on ({FETCH_AHEAD_ENV})"
# what rank 0 prints once a step's window is complete, whenever the count changes (diagnose reads the GiB its buffers
# held: memory beyond the plan)
FETCH_AHEAD_HELD = "stream fetch-ahead: {chunks} chunks ({gib:.2f} GiB) came up during the backward"
FETCH_AHEAD_SAYS = ("the chunks after the ring's come up during the backward into memory it has freed, kept below "
                    "the run's peak allocated as the previous step measured it; the same update (bit-identical to "
                    "stream without it, on the CPU stand-in and on one H100). Measured on the 4-layer MoE proxy (one "
                    "H100): the buffers added 2.9 GiB of reserved memory and no step-time gain was resolved; compare "
                    "both with it off on your model. It "
                    "resets PyTorch's peak counters at points of the backward, so Megatron Bridge's own memory log "
                    "shows the peak since the last point; the run's peak is the plugin's (summary.json, "
                    "peak_allocated_gib)")


def fetch_ahead_setting(env_vars: Mapping[str, object] | None, environ: Mapping[str, str]) -> str | None:
    """MBRIDGE_OFFLOAD_STREAM_FETCH_AHEAD as a run sees it (the shell's, else the config's), or None where unset.
    Values other than on/off come back as given (the validator names them)."""
    return _stripped_setting(FETCH_AHEAD_ENV, env_vars, environ)


def fetch_ahead_on(env_vars: Mapping[str, object] | None, environ: Mapping[str, str]) -> bool:
    return fetch_ahead_setting(env_vars, environ) == "on"


# The stream mode's moments (mbridge_offload/runtime/streamed_states.py): fp32, or bf16 on the host and in the ring.
# bf16 is opt-in: half the bytes cross the host link each way (on one H100 the ring's stand-in with half the bytes
# added 0.085-0.093 s to a forward instead of 0.219-0.270 s, docs/benchmarks/offload-engine/ring-pipeline/) and the
# host holds 8 bytes per offloaded parameter instead of 12; Transformer Engine's FusedAdam reads and writes the
# moments in bf16 and computes in fp32, so the moments are rounded at each step and the update is not the one without
# offload.
STREAM_MOMENTS_ENV = "MBRIDGE_OFFLOAD_STREAM_MOMENTS"
STREAM_MOMENTS_KEY = f"env_vars.{STREAM_MOMENTS_ENV}"
FP32_MOMENTS = "fp32"
BF16_MOMENTS = "bf16"
MOMENT_BYTES = {FP32_MOMENTS: 4, BF16_MOMENTS: 2}  # bytes of one moment's element
DEFAULT_STREAM_MOMENTS = FP32_MOMENTS
BF16_MOMENTS_FIX = f"++{STREAM_MOMENTS_KEY}={BF16_MOMENTS}"
FP32_MOMENTS_FIX = f"++{STREAM_MOMENTS_KEY}={FP32_MOMENTS}"
# the fix for a value that is neither: the validator's rule, the engine's error and the transform's say it
STREAM_MOMENTS_KNOWN_FIX = (f"{BF16_MOMENTS_FIX}  (or {FP32_MOMENTS}, the default; a value in the shell wins: set it "
                            "there)")
MASTER_WEIGHT_BYTES = 4  # the library's fp32 host copy of an offloaded weight, which the checkpoint saves
# What bf16 moments measured on a GPU against fp32 ones (docs/benchmarks/offload-engine/stream-bf16-moments/): the
# run's header and the validator's warning say it
STREAM_MOMENTS_MEASURED = (
    "on one H100 the 4-layer MoE proxy at fraction 1 ran 1.23x its baseline against 1.48x with fp32 moments; over 50 "
    "deterministic steps the loss left no offload's by more than the seed's 0.001 from step 12 or 13, by up to 0.12 "
    "on the 1.1B dense proxy and 0.98 on the MoE proxy, 1.3 to 3 times what non-deterministic runs of the same "
    "proxies differ by (docs/benchmarks/offload-engine/stream-bf16-moments/)")


def stream_moments(env_vars: Mapping[str, object] | None, environ: Mapping[str, str]) -> str:
    """MBRIDGE_OFFLOAD_STREAM_MOMENTS as a run sees it (the shell's, else the config's), else the default. Other
    values come back as given (the validator names them; the engine refuses them)."""
    value = run_env(STREAM_MOMENTS_ENV, env_vars, environ)
    return DEFAULT_STREAM_MOMENTS if value is None else value.strip()


def moment_bytes(moments: str) -> int:
    """Bytes of one moment's element for the setting ``moments`` (fp32 or bf16)."""
    if moments not in MOMENT_BYTES:
        raise ValueError(f"{STREAM_MOMENTS_ENV}={moments!r}: the moments are one of {', '.join(MOMENT_BYTES)}. Fix: "
                         f"{STREAM_MOMENTS_KNOWN_FIX}")
    return MOMENT_BYTES[moments]


def stream_host_bytes_per_param(moments: str = DEFAULT_STREAM_MOMENTS) -> int:
    """Host bytes the stream engine holds per offloaded parameter: the fp32 weight copy and the two moments."""
    return MASTER_WEIGHT_BYTES + 2 * moment_bytes(moments)


# the run's header line that says bf16 moments are on (diagnose reads it), and what the line says of them
STREAM_MOMENTS_HEADER = f"moments: {BF16_MOMENTS} on the host and in the ring ({STREAM_MOMENTS_ENV})"
STREAM_MOMENTS_SAYS = (
    f"{stream_host_bytes_per_param(BF16_MOMENTS)} bytes per offloaded parameter on the host instead of "
    f"{stream_host_bytes_per_param(FP32_MOMENTS)}, and half the bytes each way between host and GPU; Adam computes in "
    f"fp32 but its moments are rounded to {BF16_MOMENTS} at every step, so the training is NOT bit-identical to no "
    f"offload ({STREAM_MOMENTS_MEASURED}): compare the loss of the first steps with {FP32_MOMENTS} moments' (the "
    "default)")


# The stream mode's ring (mbridge_offload/runtime/streamed_states.py): the GPU buffers Adam's moments pass through.
STREAM_CHUNKS = 32  # chunks per step: the forward waits per chunk, so fewer means longer waits
STREAM_RING_SLOTS = 3  # GPU buffers: one arriving, one updated, one leaving
STREAM_MIN_CHUNK_NUMEL = 1 << 20  # below this a chunk's copies cost more in launches than they move


def stream_pacing(chunks: int, modules_before_first_gate: int) -> tuple[int, int]:
    """(forward pre-hooks per enqueue, chunks per enqueue) that spread the enqueueing of ``chunks`` chunks over
    the modules the forward meets before its first offloaded one; with fewer modules than chunks, several
    chunks each time. The training stream then has the forward's kernels to run while the thread enqueues."""
    chunks, modules = max(1, chunks), max(1, modules_before_first_gate)
    return max(1, modules // chunks), max(1, -(-chunks // modules))


def stream_chunk_numel(total: int, chunks: int = STREAM_CHUNKS, minimum: int = STREAM_MIN_CHUNK_NUMEL) -> int:
    """Elements per chunk for ``total`` offloaded elements of one optimizer."""
    return max(1, min(total, max(minimum, math.ceil(total / chunks))))


def stream_ring_bytes(offloaded_params: int, moments: str = DEFAULT_STREAM_MOMENTS) -> int:
    """GPU bytes of one optimizer's ring for ``offloaded_params`` fp32 parameters: each slot holds a chunk's two
    moments, in the dtype ``moments`` (fp32 or bf16)."""
    if offloaded_params <= 0:
        return 0
    numel = stream_chunk_numel(offloaded_params)
    return min(STREAM_RING_SLOTS, math.ceil(offloaded_params / numel)) * 2 * moment_bytes(moments) * numel


def offload_walk(sizes: list[int], walk, fraction: float) -> list[int]:
    """HybridDeviceOptimizer's rule for which tensors to offload (indices into ``sizes``): whole tensors in the
    order of ``walk`` while the total offloaded is below ``fraction`` of the total."""
    threshold = sum(sizes) * fraction
    chosen, total = [], 0
    for index in walk:
        if total >= threshold:
            break
        chosen.append(index)
        total += sizes[index]
    return chosen


def last_used_first(sizes: list[int], positions: list, fraction: float) -> list[int]:
    """The library's rule (``offload_walk``) walked from the tensor the forward uses last (the highest of
    ``positions``, any sortable values). The library walks the optimizer's order instead: Megatron's gradient
    buffers, roughly the forward reversed but group by group (every layer's weights before any norm) and bucket
    by bucket. The stream engine needs the next forward to meet the streamed chunks last, after the copies have
    had the most time, so it states that order instead of inheriting it."""
    return offload_walk(sizes, sorted(range(len(sizes)), key=lambda i: positions[i], reverse=True), fraction)
