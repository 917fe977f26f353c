"""Speed tuning for optimizer offload, applied by run_recipe.py unless ``--offload-tuning stock``.

Measured on the H200 (docs/benchmarks/offload-overhead/): what costs time in an offloaded step is the
CPU Adam, and the CPU Adam is bound by host memory bandwidth, which needs every core. The tuning sets
what the measurements favour and leaves every key a user set on the command line alone:

- CPU threads per rank: ``--cpu-threads auto`` at launch (mbridge_offload/runtime/cpu_threads.py). 1 thread (what
  torchrun gives each rank of a node running several) made 100% offload 4.3x slower than no offload
  on the 1.1B dense proxy, all 16 cores 1.85x;
- D2H/H2D overlap on, pipelined in ``TUNED_OVERLAP_CHUNKS`` chunks (mbridge_offload/runtime/chunked_overlap.py):
  one CPU optimizer per chunk, so the Adam of one chunk runs while the next chunk's gradients arrive
  and the previous chunk's parameters go back. At 100% on the dense proxy, in one session: 0.747 s
  per step against 0.917 s with overlap off and 0.820 s with the library's overlap, one CPU optimizer
  per tensor (docs/benchmarks/offload-overhead/dense-1b-chunked/). That session's "1.48x" was against
  a single baseline of an earlier machine; against baselines run beside it the same step is ~1.9-2.0x
  (issue #16): the ratio is superseded, the ordering of the three is not. The library's per-tensor
  overlap was also measured slower than overlap off in an earlier session (0.55 s vs 0.40 s optimizer step);
- pinned host buffers for gradients and parameters (``optimizer.pin_cpu_grads``/``pin_cpu_params``,
  the library's default; pageable buffers make every copy synchronous).

``stock`` keeps the configuration exactly as the recipe and the overrides made it, and leaves the
threads to the launcher: the library's behaviour, for comparison.
"""

from __future__ import annotations

from typing import Iterable

from recipes.derive import derive

TUNINGS = ("tuned", "stock")
TUNED_OVERLAP_CHUNKS = 8  # a few large chunks: enough to pipeline, few enough that each Adam call is large
TUNED_KEYS = {  # key: (tuned value, why it is faster)
    "optimizer.overlap_cpu_optimizer_d2h_h2d": (True, f"pipelined in {TUNED_OVERLAP_CHUNKS} chunks, the copies hide "
                                                      "behind the CPU Adam: 0.747 s per step at 100% on the H200's "
                                                      "1.1B proxy vs 0.917 s with overlap off"),
    "optimizer.pin_cpu_grads": (True, "pinned gradient buffers copy asynchronously at full link speed"),
    "optimizer.pin_cpu_params": (True, "pinned parameter buffers copy asynchronously at full link speed"),
}


def tune_offload(cfg, given_keys: Iterable[str] = (), overlap_chunks: int | None = None):
    """``cfg`` with optimizer offload tuned for speed; keys in ``given_keys`` (set by the user) are kept,
    and so is ``overlap_chunks`` (``--overlap-chunks``) when given.

    Returns (new config, lines for the run's header, the overlap chunks to run with or None). Without
    optimizer offload nothing changes.
    """
    if not cfg.optimizer.optimizer_cpu_offload:
        return cfg, [], overlap_chunks
    given = set(given_keys)
    deltas, lines = {}, []
    for key, (value, why) in TUNED_KEYS.items():
        name = key.removeprefix("optimizer.")
        current = getattr(cfg.optimizer, name)
        if key in given:
            lines.append(f"{key}={current} (set by you, kept)")
        elif current == value:
            lines.append(f"{key}={current} (already)")
        else:
            deltas[key] = value
            lines.append(f"{key}={value} (tuned: {why})")
    if deltas:
        cfg = derive(cfg, deltas, why="offload speed tuning (--offload-tuning stock to keep the config as is)")
    if overlap_chunks:
        lines.append(chunks_line(overlap_chunks, "--overlap-chunks, set by you, kept"))
    elif cfg.optimizer.overlap_cpu_optimizer_d2h_h2d:
        overlap_chunks = TUNED_OVERLAP_CHUNKS
        lines.append(chunks_line(overlap_chunks, "tuned: instead of the library's one CPU optimizer per tensor; "
                                                 "--overlap-chunks K to change"))
    return cfg, lines, overlap_chunks


def chunks_line(chunks: int, why: str) -> str:
    return f"D2H/H2D overlap in {chunks} chunks of about equal size ({why})"
