"""Model-parallel arithmetic of a Megatron config: one place for the grid sizes every layer uses."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParallelSizes:
    """The parallel sizes of ``model`` on ``num_gpus`` GPUs."""

    num_gpus: int
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int

    @classmethod
    def of(cls, model, num_gpus: int) -> "ParallelSizes":
        return cls(num_gpus=num_gpus, tp=model.tensor_model_parallel_size, pp=model.pipeline_model_parallel_size,
                   cp=model.context_parallel_size, ep=model.expert_model_parallel_size,
                   etp=model.expert_tensor_parallel_size or 1)

    @property
    def model_parallel(self) -> int:
        """GPUs of one model replica: TP x PP x CP."""
        return self.tp * self.pp * self.cp

    @property
    def dp(self) -> int | None:
        """Data-parallel size, or None when the GPU count does not split into the model grid."""
        if self.num_gpus % self.model_parallel:
            return None
        return self.num_gpus // self.model_parallel

    @property
    def dense_optimizer_shards(self) -> int:
        """Ranks the distributed optimizer shards dense states over: DP x CP (at least 1)."""
        return max(1, self.num_gpus // (self.tp * self.pp))

    @property
    def expert_optimizer_shards(self) -> int:
        """Ranks expert states are sharded over: the expert-data-parallel group (at least 1)."""
        return max(1, self.num_gpus // (self.pp * self.ep * self.etp))
