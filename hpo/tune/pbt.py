"""Population based training, mirrored into the Optuna study.

Ray refuses PBT with any search algorithm, so a PBT study samples its
population with Ray's own variant generator from the spec's search space; the
same space gives ``hyperparam_mutations``. :class:`RecordingPBT` is Ray's
``PopulationBasedTraining`` with one thin seam around its private ``_exploit``
(:class:`hpo.ray_private.PinnedExploits`, the module for Ray's private names) that

* records every exploit on the receiving trial (donor trial number, the update
  step, old and new hyperparameters), so that the dashboard shows the schedule
  and the lineage;
* pins donor checkpoints: when PBT remembers a top trial's checkpoint (to hand
  it to an exploiting trial later), the checkpoint is copied aside, so that the
  donor's own retention (``num_to_keep``) cannot delete it first ("Could not
  recover from checkpoint as it does not exist on storage anymore", ray#9036).

The population is drawn from the spec's own grids (:func:`ray_domain`), and
explored values are put back on them (Ray scales them by 1.2 or 0.8 without
bounds; PB2's GP picks any value in the bounds) through PBT's public
``custom_explore_fn`` (:func:`clip_to_space`).
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from ray import tune
from ray.tune.schedulers import PopulationBasedTraining
from ray.tune.schedulers.pb2 import PB2
from ray.tune.search.sample import Domain, Float, Integer, Sampler

from hpo.ray_private import PinnedExploits
from hpo.record import StudyRecord
from hpo.space import grid_count, grid_point, snap
from hpo.spec import CategoricalParam, FloatParam, IntParam, StudySpec

TIME_ATTR = "step"


class OnGrid(Sampler):
    """Ray sampler drawing uniformly from a parameter's grid ``low + k*step``.

    Ray's ``qrandint``/``quniform`` draw multiples of ``q`` (``{2, 4}`` for
    ``[1, 5]`` step 2) and ``quniform`` refuses a ``low`` that is not a multiple
    of ``q``; here an index ``k`` in ``[0, n)`` is drawn and mapped to the grid
    (:func:`hpo.space.grid_point`), so every grid value is reachable and
    nothing else (issue 11).
    """

    def __init__(self, param: FloatParam | IntParam) -> None:
        self.param = param
        self.n = grid_count(param)

    def sample(self, domain: Domain, config=None, size: int = 1, random_state=None):
        if random_state is None:  # Domain.sample always passes Ray's wrapper of a generator
            random_state = np.random.default_rng()
        values = [grid_point(self.param, int(k))
                  for k in random_state.integers(0, self.n, size=size)]
        return values if size > 1 else values[0]

    def __str__(self) -> str:
        return f"OnGrid(step={self.param.step})"


def ray_domain(param: FloatParam | IntParam | CategoricalParam) -> Domain:
    """The Ray Tune search domain of one search-space parameter.

    Values are the spec's: categorical choices; ints and stepped floats on the
    grid ``low + k*step`` (:class:`OnGrid`); log ints and floats log-uniform in
    ``[low, high]``; other floats uniform in ``[low, high]``.
    """
    if isinstance(param, CategoricalParam):
        return tune.choice(list(param.choices))
    if isinstance(param, IntParam) and param.log:
        return tune.lograndint(param.low, param.high + 1)  # floor(exp(U)): [low, high]
    if isinstance(param, FloatParam) and param.step is None:
        if param.log:
            return tune.loguniform(param.low, param.high)
        return tune.uniform(param.low, param.high)
    domain = Integer(param.low, param.high) if isinstance(param, IntParam) else \
        Float(param.low, param.high)
    domain.set_sampler(OnGrid(param))
    return domain


def param_space(spec: StudySpec) -> dict[str, Any]:
    """Ray's ``param_space`` of a PBT/PB2 study: one :func:`ray_domain` per parameter."""
    return {name: ray_domain(p) for name, p in spec.search_space.items()}


def clip_to_space(spec: StudySpec) -> Callable[[dict], dict]:
    """A ``custom_explore_fn`` putting explored values back on the search space: clipped
    into ``[low, high]`` and snapped to the nearest grid point (:func:`hpo.space.snap`).

    PBT scales a value by 0.8 or 1.2 (rounding ints), PB2 takes its GP's choice
    anywhere in ``[low, high]`` (truncated to int for int parameters); both may
    leave the bounds or the grid.
    """

    def clip(config: dict) -> dict:
        for name, p in spec.search_space.items():
            if name in config:
                config[name] = snap(p, config[name])
        return config

    return clip


def exploit_recorder(spec: StudySpec, record: StudyRecord):
    """The ``on_exploit`` hook of :class:`hpo.ray_private.PinnedExploits`: the exploit, on
    the search space's parameters only, written to the receiving trial's record."""
    names = list(spec.search_space)

    def on_exploit(trial_id: str, donor_id: str, step: int | None, old: dict,
                   new: dict) -> None:
        record.exploited(trial_id, donor_id, step, {k: old.get(k) for k in names},
                         {k: new.get(k) for k in names})

    return on_exploit


class RecordingPBT(PinnedExploits, PopulationBasedTraining):
    """Ray's PopulationBasedTraining (Jaderberg et al., 2017) with the lineage seam."""


class RecordingPB2(PinnedExploits, PB2):
    """Ray's PB2 (Parker-Holder et al., 2020; GP-bandit exploration) with the lineage seam."""


def build_pbt(spec: StudySpec, record: StudyRecord | None, pin_dir: Path
              ) -> PopulationBasedTraining:
    """The scheduler of a ``pbt`` or ``pb2`` spec (interval in optimizer updates); its
    exploits go to ``record`` (none without one). Run it inside
    ``hpo.tune.schedulers.RecordingScheduler``, which records its trials' results."""
    s = spec.scheduler
    # Ray warns that num_to_keep <= 2 breaks PBT restores; the pinning above is the fix.
    warnings.filterwarnings("ignore", message=r"Using `CheckpointConfig.num_to_keep <= 2`")
    common = dict(pin_dir=pin_dir, on_exploit=record and exploit_recorder(spec, record),
                  time_attr=TIME_ATTR, perturbation_interval=s.perturbation_interval,
                  quantile_fraction=s.quantile_fraction, custom_explore_fn=clip_to_space(spec),
                  log_config=False)
    if s.name == "pb2":
        bounds = {name: [p.low, p.high] for name, p in spec.search_space.items()}
        return RecordingPB2(hyperparam_bounds=bounds, **common)
    mutations = {name: (list(p.choices) if isinstance(p, CategoricalParam) else ray_domain(p))
                 for name, p in spec.search_space.items()}
    return RecordingPBT(hyperparam_mutations=mutations,
                        resample_probability=s.resample_probability, **common)


def remove_pins(pin_dir: Path) -> None:
    """Delete the pinned donor checkpoints once the study's trials have ended."""
    shutil.rmtree(pin_dir, ignore_errors=True)
