"""The loop's refusals: an epoch that cannot make a single update."""

from __future__ import annotations

import pytest

from tests.trainers.toy_tasks import IndexedDataset, RegressionOptions, RegressionTask
from trainers import TrainConfig, TrainersError, fit


class EmptyTraining(RegressionTask):
    """``RegressionTask`` without a single training sample."""

    def datasets(self, seed: int):
        train, val = super().datasets(seed)
        return IndexedDataset(*(t[:0] for t in train.tensors)), val


def test_an_empty_training_set_is_refused_before_any_epoch():
    # before: max_epochs "finished" with 0 updates and no error; max_updates alone looped
    # over empty epochs forever (checked second, so that the unfixed loop fails, not hangs)
    for limits in [dict(max_epochs=3, max_updates=None), dict(max_epochs=None, max_updates=5)]:
        task = EmptyTraining(RegressionOptions(n_samples=16))
        with pytest.raises(TrainersError, match=r"^the training set of task 'toy-regression' "
                                                r"is empty \(epoch 0\)$"):
            fit(task, TrainConfig(micro_batch_size=4, **limits))
        assert task.seen == []
