"""The host memory of the training data loader: its pinned batches in flight, and the batch being pinned.

Derived from the installed code, not fitted (Megatron Bridge, Megatron Core 0.19.2, PyTorch 2.13):

- The recipes' dataset is Megatron Core's GPTDataset (mock data included: MockGPTDataset). With
  ``dataset.create_attention_mask`` (Megatron Core's default True, ``megatron/core/datasets/gpt_dataset.py:38``;
  no recipe here sets it) every sample carries a causal mask ``[1, seq, seq]`` of bool, 1 B an element
  (``gpt_dataset.py:798-801,836-837,335-341``), beside tokens, labels and position_ids (int64) and the loss mask
  (float32) of ``seq`` elements each. The default collate stacks ``micro_batch`` samples in a worker, into shared
  memory (``torch/utils/data/_utils/collate.py:269-273``). The training step does not even use the mask
  (``skip_getting_attention_mask_from_dataset=True`` in recipes/base.py;
  ``megatron/bridge/training/gpt_step.py:246-266`` drops it), but the loader has pinned it by then.
- Bridge's loader (``megatron/bridge/data/samplers.py:114-121``, from ``data/loaders.py:321-335``) passes
  ``num_workers`` (2 in every recipe), ``pin_memory`` (True, ``data/base.py:40``) and no ``prefetch_factor``, so
  PyTorch's default 2 (``torch/utils/data/dataloader.py:292-293``): the iterator keeps ``prefetch_factor x
  num_workers`` batches requested (``dataloader.py:1275-1276,1532``, one more sent as each is taken,
  ``dataloader.py:1563-1565``), and its pin-memory thread pins each into an unbounded queue
  (``_utils/pin_memory.py:28-42``, ``dataloader.py:1194``). Between steps all of them sit pinned: 4 batches.
- Each tensor of a batch is its own block of PyTorch's caching host allocator, rounded up to a power of two
  (``ATen/core/CachingHostAllocator.h:300-305``; the round and cache limits default to no limit,
  ``c10/core/AllocatorConfig.h:361-363``). The batch the step took frees its blocks before the next is pinned,
  so the allocator holds the in-flight count of each block size.
- While the pin-memory thread copies a batch, the worker's shared-memory batch is mapped into the training
  process (its pages count in the RSS) at its exact size: the RSS's high water is a batch above the step-end RSS.

Checked on every committed run with a pinned record (docs/benchmarks/, 2048-16384 tokens, micro batch 1-4):
the pinned memory beyond the offload's (memory_plan: ``library_pinned_bytes``) is 4 power-of-two blocks of each
batch tensor to 0.0001 GiB (1.0017 GiB at 16384 tokens and at 12288, whose 144 MiB mask rounds to 256 MiB; 0.5017
GiB at 6144 x 2), but a few runs where the allocator reused a cached offload block of the same size (the plan is up
to 4 blocks high there, at most 0.06 GiB); and the RSS high water is the step-end RSS plus one batch's mask, to
0.004 GiB (tests/planning/test_data_loader.py).
"""

from __future__ import annotations

# PyTorch's DataLoader default (torch/utils/data/dataloader.py:292-293): Bridge passes none (data/samplers.py:114-121)
PREFETCH_FACTOR = 2


def _pow2(n: int) -> int:
    """The caching host allocator's block for ``n`` bytes (CachingHostAllocator.h:302-305)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def batch_tensor_bytes(cfg) -> tuple[int, ...]:
    """The bytes of each tensor of one training batch of a GPT dataset (Megatron Core's GPTDataset.__getitem__,
    collated over the micro batch): tokens, labels, position_ids (int64), loss_mask (float32) and, with
    ``create_attention_mask`` and no inter-document masking, the bool attention mask [mb, 1, seq, seq]. Empty for a
    dataset of another kind (not planned: its batches were not measured)."""
    d = getattr(cfg, "dataset", None)
    if d is None or not hasattr(d, "create_attention_mask"):
        return ()
    # Bridge's config sets sequence_length from seq_length when it is finalized (config.py), after overrides
    seq = getattr(d, "seq_length", None) or getattr(d, "sequence_length", None) or cfg.model.seq_length
    tokens = cfg.train.micro_batch_size * seq
    sizes = [8 * tokens, 8 * tokens, 4 * tokens, 8 * tokens]
    if getattr(d, "inter_document_masking", False):
        sizes.append(4 * (tokens + cfg.train.micro_batch_size))  # cu_seqlens, int32 [mb, seq + 1]
    elif d.create_attention_mask:
        sizes.append(tokens * seq)
    return tuple(sizes)


def _workers(cfg) -> int:
    """The training loader's worker processes (0 without a dataset config)."""
    return getattr(getattr(cfg, "dataset", None), "num_workers", 0) or 0


def batches_in_flight(cfg) -> int:
    """The batches the training loader holds pinned between steps: prefetch_factor x num_workers with workers;
    without them the main process pins one batch at a time (the allocator keeps its blocks). 0 without
    pin_memory."""
    if not getattr(getattr(cfg, "dataset", None), "pin_memory", False):
        return 0
    workers = _workers(cfg)
    return PREFETCH_FACTOR * workers if workers > 0 else 1


def data_loader_pinned_bytes(cfg) -> int:
    """Pinned host bytes of the training loader between steps: the batches in flight, each tensor a power-of-two
    block."""
    return batches_in_flight(cfg) * sum(_pow2(n) for n in batch_tensor_bytes(cfg))


def data_loader_transient_bytes(cfg) -> int:
    """Bytes above the step-end RSS while a batch is pinned (or, without pin_memory, taken): the worker's
    shared-memory batch mapped into the training process, unrounded. 0 without workers (the batch is collated in
    the process and its pinned copy already counted)."""
    return sum(batch_tensor_bytes(cfg)) if _workers(cfg) > 0 else 0
