"""The three offload engines with expert and pipeline parallelism over several ranks, on the CPU (no GPU here).

stream_cpu_check.py ranks / exact-ranks / delayed-ranks each also run the 12.6M-parameter model of
stream_cpu_scenarios.py with an expert matrix in every block (2M parameters more, marked as Megatron marks an
expert's: ``allreduce = False``), on 2 gloo ranks with expert parallelism 2 (every dense tensor over 2
data-parallel ranks, each rank its own experts: expert-data-parallel groups of one) and on 4 with expert
parallelism 2 (expert-data-parallel groups of two). Megatron Core's real DistributedDataParallel gives the experts
buffers and bucket groups of their own; get_megatron_optimizer builds a ChainedOptimizer of a dense and an experts'
DistributedOptimizer, each over its own HybridDeviceOptimizer, so the plugin installs two engines that share one
worker thread. Each rank checks:

- every module's forward used the weights the engine promises (stream, exact: after every earlier update; delayed:
  the offloaded elements one update behind, the rest current), each rank its own experts, against torch AdamW on
  the full fp32 tensors: a dense tensor's gradient is the ranks' mean, an expert's the sum over its
  expert-data-parallel group divided by the world size (how Megatron's DDP scales it), clipped by the global norm
  over the dense gradients and every expert-parallel rank's experts;
- after the drain of a save or an evaluation, every rank holds the whole weights after the last update;
- every fp32 shard and Adam moment of both optimizers, and each offloaded shard's host copy, equals the
  reference's.

Reference arithmetic checked to matter: with the experts' gradients scaled as the dense ones (the wrong
reference), both scenarios fail.

The same three runs also train the model without experts in 2 pipeline stages on 4 gloo ranks (2 data-parallel
ranks each), through Megatron Core's 1F1B schedule (forward_backward_pipelining_without_interleaving, its
point-to-point sends, finalize_model_grads) in 4 micro batches per step: each stage has its own distributed
optimizer and engine, and every micro batch's forward runs the engine's waits. The same checks, against torch AdamW
clipped by the norm over both stages (a reference clipped by its own stage's norm fails). Each stage has 2 ranks: a
stage of one rank all-gathers its parameters in place without waiting for the exact engine's cast into them, which
is safe with NCCL but races with the cast on gloo (streaming_engine's gate_param_gather says why).

The GPU is stream_cpu_device.py's stand-in (what that hides: its docstring).
"""

from __future__ import annotations

import pytest

KIND_OF_ENGINE = {"stream": "ranks", "exact": "exact-ranks", "delayed": "delayed-ranks"}
LABELS = ["2 ranks, EP 2 (experts on one rank each), fraction 0.6, overlapped all-gather",
          "4 ranks, EP 2 (experts on two ranks each), fraction 1, all-gather in the step",
          "4 ranks, 2 pipeline stages x DP 2, fraction 0.6, overlapped all-gather"]


@pytest.mark.parametrize("label", LABELS)
@pytest.mark.parametrize("engine", list(KIND_OF_ENGINE))
def test_engine_with_experts_or_stages_updates_every_optimizer_as_adamw_on_every_rank(
        stream_scenarios, engine, label):
    stream_scenarios.assert_passed(KIND_OF_ENGINE[engine], label)
