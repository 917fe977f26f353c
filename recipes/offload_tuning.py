"""Speed tuning for optimizer offload, applied by run_recipe.py unless ``--offload-tuning stock``.

Measured on the H200 (docs/benchmarks/offload-overhead/): what costs time in an offloaded step is the
CPU Adam and the copies around it. The tuning turns on what shortens them and leaves every key a
user set on the command line alone:

- D2H/H2D overlap (``optimizer.overlap_cpu_optimizer_d2h_h2d``): one CPU optimizer per parameter, so
  each parameter's copies run while Adam works on another;
- pinned host buffers for gradients and parameters (``optimizer.pin_cpu_grads``/``pin_cpu_params``,
  the library's default; pageable buffers make every copy synchronous and slower);
- CPU threads per rank: ``--cpu-threads auto`` at launch (recipes/cpu_threads.py).

``stock`` keeps the configuration exactly as the recipe and the overrides made it, and leaves the
threads to the launcher: the library's behaviour, for comparison.
"""

from __future__ import annotations

from typing import Iterable

from recipes.derive import derive

TUNINGS = ("tuned", "stock")
TUNED_KEYS = {  # key: (tuned value, why it is faster)
    "optimizer.overlap_cpu_optimizer_d2h_h2d": (True, "copies overlap the CPU Adam of other parameters"),
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
        section, name = key.split(".")
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
