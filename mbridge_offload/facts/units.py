"""Units used across the project: one definition each."""

GIB = 1024**3  # memory sizes (GiB), as PyTorch and /proc report them
GB = 1e9  # bandwidths (GB/s), as hardware is specified
