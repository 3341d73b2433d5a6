"""TRL's ``GRPOTrainer`` with one change for ``selfrag rl``: the question order is a function of the epoch.

    trainer = SelfRAGGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), rollout_func=...)

TRL 1.16's ``RepeatSampler`` draws every epoch's shuffle from one generator seeded once, so a run resumed from a
checkpoint starts that generator again and meets the questions in the first epoch's order, not the order the killed
run would have met them in. Here each epoch's order is drawn from ``seed + epoch`` (the Trainer calls ``set_epoch``
before each epoch, a resumed one included), so a resumed run trains on what the killed one would have
(``tests/app/test_rl_train.py``). Everything else (rollouts through ``rollout_func``, the ``env_mask`` on the loss)
is TRL's own.
"""

from __future__ import annotations

from typing import Any

import torch
from trl import GRPOTrainer
from trl.trainer.utils import RepeatSampler


class EpochSampler(RepeatSampler):
    """``RepeatSampler`` whose shuffle is reseeded with ``seed + epoch`` at each epoch."""

    def set_epoch(self, epoch: int) -> None:
        if self.shuffle:
            self.generator = torch.Generator()
            self.generator.manual_seed((self.seed or 0) + int(epoch))


class SelfRAGGRPOTrainer(GRPOTrainer):
    """GRPO with an epoch-seeded question order (see the module docstring)."""

    def _get_train_sampler(self, dataset: Any = None) -> Any:
        sampler: Any = super()._get_train_sampler(dataset)  # a RepeatSampler (typed as Sampler by TRL)
        return EpochSampler(
            data_source=sampler.data_source, mini_repeat_count=sampler.mini_repeat_count,
            batch_size=sampler.batch_size, repeat_count=sampler.repeat_count, shuffle=sampler.shuffle,
            seed=sampler.seed,
        )
