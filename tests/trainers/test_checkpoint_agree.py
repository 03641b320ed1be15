"""Ranks that resume one root agree on one checkpoint (``load_checkpoint(agree=)``), seen
with ranks as threads and an all-gather through a barrier: several rounds, ranks whose
lists differ, errors outside the read itself, and one state held at a time (helper-42's
findings against the first version). test_ddp_resume.py runs the real thing under
torchrun."""

from __future__ import annotations

import errno
import gc
import pathlib
import pickle
import threading
import weakref

import pytest
import torch

from trainers import checkpoint as ckpt
from trainers import checkpoint_read
from trainers.errors import CheckpointError

META = {"task": "toy"}


def make_root(root: pathlib.Path, steps: list[int], torn: tuple[int, ...] = ()) -> None:
    for step in steps:
        ckpt.save_checkpoint(root, step, {"trainer": {"step": step}, "blob": torch.zeros(1)},
                             META, keep_last=100, durable=False)
    for step in torn:
        (root / f"checkpoint-{step:08d}" / "state.pt").write_bytes(b"torn")


def resume_together(roots: list[pathlib.Path]) -> tuple[list, list[int]]:
    """Each rank's ``("ok", step)`` or ``("raised", message)``, and how many times each
    called the collective: a rank that skipped one would leave the others waiting."""
    n = len(roots)
    slots, calls, barrier = [None] * n, [0] * n, threading.Barrier(n, timeout=20)
    results: list = [None] * n

    def agree_for(rank: int):
        def agree(offer: int) -> list[int]:
            calls[rank] += 1
            slots[rank] = offer
            barrier.wait()
            out = list(slots)
            barrier.wait()
            return out
        return agree

    def rank_body(rank: int) -> None:
        try:
            state = checkpoint_read.load_checkpoint(roots[rank], agree=agree_for(rank))
            results[rank] = ("ok", state["trainer"]["step"])
        except CheckpointError as e:
            results[rank] = ("raised", str(e))

    threads = [threading.Thread(target=rank_body, args=(r,), name=f"rank{r}")
               for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, calls


def test_ranks_agree_over_several_rounds_on_the_newest_step_every_rank_loads(tmp_path):
    # rank 0 offers 6, rank 1 (6 torn) 5; rank 0 has no 5 and offers 4; rank 1 has no 4
    # and offers 3; ... until both hold 2
    make_root(tmp_path / "a", [2, 4, 6])
    make_root(tmp_path / "b", [2, 3, 5, 6], torn=(6,))
    results, calls = resume_together([tmp_path / "a", tmp_path / "b"])
    assert results == [("ok", 2), ("ok", 2)]
    assert calls[0] == calls[1] == 5


def test_ranks_that_share_no_loadable_step_all_fail_saying_so(tmp_path):
    make_root(tmp_path / "a", [2, 4, 6])
    make_root(tmp_path / "b", [3, 5, 6], torn=(6,))
    results, calls = resume_together([tmp_path / "a", tmp_path / "b"])
    assert calls[0] == calls[1]
    assert results[0] == ("raised", f"another rank of this run could not load a checkpoint "
                                    f"of {tmp_path / 'a'}: see its error")
    assert results[1] == ("raised", f"no checkpoint under {tmp_path / 'b'} at or before step "
                                    f"2 loads on this rank, and no later one on every rank "
                                    f"of this run")


@pytest.mark.parametrize("where", ["listing", "reading"])
def test_a_stat_error_on_one_rank_fails_every_rank(tmp_path, monkeypatch, where):
    """``Path.is_file`` raises on EIO or EACCES (Python 3.11): outside the unpickling, it
    failed rank 1 alone while rank 0 waited in the collective."""
    root = tmp_path / "r"
    make_root(root, [1, 2, 3])
    real_is_file = pathlib.Path.is_file
    listed = threading.Event()

    def is_file(self):
        if threading.current_thread().name == "rank1" and self.name == "state.pt" and (
                where == "listing" or listed.is_set()):
            raise OSError(errno.EIO, "Input/output error", str(self))
        return real_is_file(self)

    real_list = ckpt.list_checkpoints

    def list_then_fail(root_):
        found = real_list(root_)
        if threading.current_thread().name == "rank1":
            listed.set()
        return found

    monkeypatch.setattr(pathlib.Path, "is_file", is_file)
    monkeypatch.setattr(ckpt, "list_checkpoints", list_then_fail)
    results, calls = resume_together([root, root])
    assert calls == [1, 1]
    assert results[0][0] == results[1][0] == "raised"
    assert results[0][1].startswith("another rank of this run")
    assert "OSError: [Errno 5] Input/output error" in results[1][1]
    assert results[1][1].startswith("cannot list the checkpoints" if where == "listing"
                                    else "cannot read checkpoint")


def test_a_rank_holds_one_state_at_a_time_while_the_ranks_search(tmp_path, monkeypatch):
    make_root(tmp_path / "r", [1, 2, 3, 4])
    live: dict[str, weakref.WeakSet] = {"rank0": weakref.WeakSet(), "rank1": weakref.WeakSet()}
    peak = {"rank0": 0, "rank1": 0}
    real_load, real_torch_load = checkpoint_read._load_state, torch.load

    def load_state(path):
        gc.collect()
        me = threading.current_thread().name
        peak[me] = max(peak[me], len(live[me]) + 1)  # + the one loading now
        state = real_load(path)
        live[me].add(state["blob"])
        return state

    def torn_for_rank_1(f, *args, **kwargs):  # rank 1 loads only step 1: rank 0 falls back
        if threading.current_thread().name == "rank1" and \
                pathlib.Path(f).parent.name >= "checkpoint-00000002":
            raise pickle.UnpicklingError("torn as this rank reads it")
        return real_torch_load(f, *args, **kwargs)

    monkeypatch.setattr(checkpoint_read, "_load_state", load_state)
    monkeypatch.setattr(torch, "load", torn_for_rank_1)
    results, _ = resume_together([tmp_path / "r", tmp_path / "r"])
    assert results == [("ok", 1), ("ok", 1)]
    assert peak == {"rank0": 1, "rank1": 1}
