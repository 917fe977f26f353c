"""Launch training for a validated config (only reached after validation passed)."""

from __future__ import annotations

import sys


def launch(cfg, recipe, num_gpus: int) -> int:
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device on this machine: the configuration above is valid, but training needs a GPU. "
              "Run the same command on a GPU node (under torchrun for several GPUs), or add --dry-run.",
              file=sys.stderr)
        return 1
    raise NotImplementedError
