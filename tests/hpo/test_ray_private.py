"""hpo.ray_private's Ray Train seam: the trainer of multi-worker trials starts no
placement-group cleaner (the cluster-level check is in test_fsdp_study)."""

from __future__ import annotations

import pickle

import ray.train
from ray.train.torch import TorchTrainer

from hpo import ray_private


def _callbacks(trainer_class: type) -> list[str]:
    trainer = trainer_class(lambda config: None,
                            scaling_config=ray.train.ScalingConfig(num_workers=2))
    return [type(c).__name__ for c in trainer._create_default_callbacks()]


def test_the_multi_worker_trainer_drops_only_ray_trains_placement_group_cleaner():
    joined = ray.is_initialized()  # another test of this process may have started Ray
    theirs = _callbacks(TorchTrainer)
    ours = _callbacks(ray_private.TorchTrainerWithoutCleaner)
    assert "PlacementGroupCleanerCallback" in theirs  # else the override has nothing to do
    assert ours == [name for name in theirs if name != "PlacementGroupCleanerCallback"]
    assert ray.is_initialized() == joined  # building the trainer starts no Ray


def test_the_trainer_class_pickles_by_reference():
    cls = ray_private.TorchTrainerWithoutCleaner
    assert pickle.loads(pickle.dumps(cls)) is cls
    assert issubclass(cls, TorchTrainer) and cls.__module__ == "hpo.ray_private"
