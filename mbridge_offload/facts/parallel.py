"""Model-parallel arithmetic of a Megatron config: one place for the grid sizes every layer uses."""

from __future__ import annotations

from dataclasses import dataclass


def _whole(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


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
        """The sizes as the config has them; one that is not a whole number (null, a bool, text) counts as 0,
        which no grid splits into (its range rule reports the key)."""
        return cls(num_gpus=_whole(num_gpus), tp=_whole(model.tensor_model_parallel_size),
                   pp=_whole(model.pipeline_model_parallel_size), cp=_whole(model.context_parallel_size),
                   ep=_whole(model.expert_model_parallel_size), etp=_whole(model.expert_tensor_parallel_size or model.tensor_model_parallel_size))  # null: TP's, as Megatron

    @property
    def model_parallel(self) -> int:
        """GPUs of one model replica: TP x PP x CP."""
        return self.tp * self.pp * self.cp

    @property
    def dp(self) -> int | None:
        """Data-parallel size, or None when the GPU count does not split into the model grid."""
        if self.model_parallel < 1 or self.num_gpus < 1 or self.num_gpus % self.model_parallel:
            return None
        return self.num_gpus // self.model_parallel

    @property
    def dense_optimizer_shards(self) -> int:
        """Ranks the distributed optimizer shards dense states over: DP x CP (at least 1)."""
        return max(1, self.num_gpus // max(1, self.tp * self.pp))

    @property
    def expert_optimizer_shards(self) -> int:
        """Ranks expert states are sharded over: the expert-data-parallel group (at least 1)."""
        return max(1, self.num_gpus // max(1, self.pp * self.ep * self.etp))
