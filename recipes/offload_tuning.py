"""Speed tuning for optimizer offload, applied by run_recipe.py unless ``--offload-tuning stock``.

Measured on the H200 (docs/benchmarks/offload-overhead/): what costs time in an offloaded step is the
CPU Adam, and the CPU Adam is bound by host memory bandwidth, which needs every core. The tuning sets
what the measurements favour and leaves every key a user set on the command line alone:

- CPU threads per rank: ``--cpu-threads auto`` at launch (recipes/cpu_threads.py). 1 thread (what
  torchrun gives each rank of a node running several) made 100% offload 4.3x slower than no offload
  on the 1.1B dense proxy, all 16 cores 1.85x;
- D2H/H2D overlap off (``optimizer.overlap_cpu_optimizer_d2h_h2d``): overlap runs one CPU optimizer
  per parameter while the copies stream through the same host memory, and made the offloaded
  optimizer step 37% longer on the dense proxy (0.55 s vs 0.40 s at 100%) and 12% longer on the
  Qwen3-30B-A3B proxy (1.24 s vs 1.10 s);
- pinned host buffers for gradients and parameters (``optimizer.pin_cpu_grads``/``pin_cpu_params``,
  the library's default; pageable buffers make every copy synchronous).

``stock`` keeps the configuration exactly as the recipe and the overrides made it, and leaves the
threads to the launcher: the library's behaviour, for comparison.
"""

from __future__ import annotations

from typing import Iterable

from recipes.derive import derive

TUNINGS = ("tuned", "stock")
TUNED_KEYS = {  # key: (tuned value, why it is faster)
    "optimizer.overlap_cpu_optimizer_d2h_h2d": (False, "overlap made the offloaded step longer on the H200: the "
                                                       "copies compete with the CPU Adam for host memory"),
    "optimizer.pin_cpu_grads": (True, "pinned gradient buffers copy asynchronously at full link speed"),
    "optimizer.pin_cpu_params": (True, "pinned parameter buffers copy asynchronously at full link speed"),
}


def tune_offload(cfg, given_keys: Iterable[str] = ()):
    """``cfg`` with optimizer offload tuned for speed; keys in ``given_keys`` (set by the user) are kept.

    Returns (new config, lines for the run's header). Without optimizer offload nothing changes.
    """
    if not cfg.optimizer.optimizer_cpu_offload:
        return cfg, []
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
    return cfg, lines
