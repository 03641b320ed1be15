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


@pytest.mark.parametrize("limits", [dict(max_epochs=3, max_updates=None),
                                    dict(max_epochs=None, max_updates=5)])
def test_an_empty_training_set_is_refused_before_any_epoch(limits):
    # before: max_epochs "finished" with 0 updates and no error; max_updates alone looped
    # over empty epochs forever (max_epochs first, so that the unfixed loop fails, not hangs)
    task = EmptyTraining(RegressionOptions(n_samples=16))
    with pytest.raises(TrainersError, match=r"^the training set of task 'toy-regression' is "
                                            r"empty \(epoch 0\)$"):
        fit(task, TrainConfig(micro_batch_size=4, **limits))
    assert task.seen == []
