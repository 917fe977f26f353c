"""What bit-reproducible training needs on this stack: the config keys and the environment.

Measured on the H200 (docs/benchmarks/resume-parity/): with these, two baseline runs of the 4-layer dense
proxy were bit-identical over 10 steps, and 100% optimizer offload stayed within 2.7e-4 of them;
without them identical baselines differ by 0.002-0.006 in loss.
"""

from __future__ import annotations

# Megatron Bridge refuses deterministic_mode with the fused cross entropy (not deterministic).
DETERMINISTIC_KEYS = {"model.deterministic_mode": True, "model.cross_entropy_loss_fusion": False}

# Environment, with why each matters:
# - NCCL_ALGO: upstream ConfigContainer.validate() asserts it is one of NCCL_ALGO_CHOICES in deterministic mode;
# - NVTE_ALLOW_NONDETERMINISTIC_ALGO=0: Transformer Engine then picks only deterministic attention kernels;
# - CUBLAS_WORKSPACE_CONFIG: torch.use_deterministic_algorithms(True) (set by upstream in deterministic
#   mode) raises at the first cuBLAS call unless it is one of CUBLAS_WORKSPACE_CHOICES.
DETERMINISTIC_ENV = {"NCCL_ALGO": "Ring", "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
NCCL_ALGO_CHOICES = ("Tree", "Ring", "CollnetDirect", "CollnetChain", "^NVLS")  # upstream's list
CUBLAS_WORKSPACE_CHOICES = (":4096:8", ":16:8")  # PyTorch's reproducibility notes

# The seed's loss-parity bound; with deterministic runs it is judged exactly against it (no noise floor).
SEED_PARITY = 1e-3
