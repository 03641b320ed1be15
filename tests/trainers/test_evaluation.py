"""Evaluation sharded over DDP ranks: a validation set smaller than the world size."""

from __future__ import annotations

import pytest

from tests.trainers.torchrun import rank_results


@pytest.mark.slow  # torchrun with 2 ranks: about 8 s on 2 idle cores
def test_ddp_validation_set_smaller_than_world_size_is_evaluated_once(tmp_path):
    # 2 ranks, 1 validation sample: rank 1 has none of its own. Before, it summed no
    # statistics ({}) and the ranks' reductions disagreed (KeyError 'loss' on rank 1)
    r0, r1 = rank_results("tests.trainers.tinyval_worker", tmp_path)
    # the one sample counts once: its own squared error, exactly, on both ranks
    assert r0["val_loss"] == r1["val_loss"] == r0["expected"] == r1["expected"]
    # an empty validation set is refused on every rank alike
    assert r0["empty"] == r1["empty"] == "the validation set of task 'toy-regression' is empty"
