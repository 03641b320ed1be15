"""DDP ranks resuming a root agree on one checkpoint (helper-40's finding against the
torn-checkpoint fallback: two gloo ranks that fell back on their own resumed from steps 6
and 5; until then a DDP run did not fall back at all). One torchrun, 2 ranks, the
scenarios of ``torn_worker.py``."""

from __future__ import annotations

import pytest
import torch

from tests.trainers.torchrun import rank_results
from tests.trainers.torn_worker import STOP_AT

pytestmark = pytest.mark.slow  # one torchrun, 2 ranks, 6 short runs


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("torn")


@pytest.fixture(scope="module")
def ranks(out):
    return rank_results("tests.trainers.torn_worker", out)


def test_the_interrupted_run_left_checkpoints_up_to_its_stop(ranks):
    assert ranks[0]["steps"] == list(range(1, STOP_AT + 1))  # one at each evaluation


@pytest.mark.parametrize("name", ["torn-on-rank-1", "torn-on-both"])
def test_ranks_resume_together_from_the_newest_checkpoint_all_can_load(ranks, name):
    for got in ranks:
        assert got[name]["first_step"] == STOP_AT  # from checkpoint 5: 6 is torn for one
        assert torch.equal(got[name]["params"], got["full"])  # bit-identical to no stop


def test_a_read_error_on_one_rank_fails_every_rank_naming_it(ranks, out):
    assert "OSError: [Errno 5] Input/output error" in ranks[1]["eio-on-rank-1"]["error"]
    assert ranks[0]["eio-on-rank-1"]["error"] == (
        f"another rank of this run could not load a checkpoint of {out / 'eio-on-rank-1'}: "
        f"see its error")


def test_a_rank_that_loads_nothing_fails_every_rank(ranks):
    assert "no older checkpoint under" in ranks[1]["all-torn-on-rank-1"]["error"]
    assert ranks[0]["all-torn-on-rank-1"]["error"].startswith("another rank of this run")
