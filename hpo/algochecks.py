"""Whether a spec's sampler and scheduler can serve its search space and objectives.

Part of :func:`hpo.validation.check_against_task` (which re-exports the names here):
multi-objective studies, the grid sampler's grid, PBT and PB2's mutable parameters,
study-level stopping. Each problem is one ``{"loc", "msg"}`` entry naming its field.
"""

from __future__ import annotations

import trainers
from hpo.params import CategoricalParam, FloatParam
from hpo.space import grid_size
from hpo.spec import POPULATION_SCHEDULERS, StudySpec

SINGLE_OBJECTIVE_SAMPLERS = {"cmaes", "gp"}
MAX_GRID_SIZE = 1_000_000  # points of the grid sampler's full grid (it builds them all)


def _count(n: int) -> str:
    return f"{n:,}" if n < 10**18 else "more than 10**18"


def check_sampler_and_scheduler(spec: StudySpec, task_cls: type[trainers.Task]) -> list[dict]:
    """The problems that keep ``spec``'s sampler or scheduler from serving it (``[]`` if none):
    several objectives with a single-objective algorithm, a grid without steps or of more
    than :data:`MAX_GRID_SIZE` points, PBT/PB2 without numeric or mutable parameters, and
    ``budget.stop_when`` where it cannot apply."""
    errors = []
    sampler, scheduler = spec.sampler.name, spec.scheduler.name
    if spec.is_multi_objective:
        if sampler in SINGLE_OBJECTIVE_SAMPLERS:
            errors.append({"loc": "sampler.name",
                           "msg": f"{sampler} optimizes one objective; use tpe, nsga2, random "
                                  "or grid for several"})
        if scheduler not in ("fifo", "mo-asha"):
            errors.append({"loc": "scheduler.name",
                           "msg": f"{scheduler} stops trials by one objective; use mo-asha "
                                  "or fifo for several"})
        if spec.objective_reduce != "last":
            errors.append({"loc": "objective_reduce", "msg": "must be last with several "
                                                             "objectives"})
    elif scheduler == "mo-asha":
        errors.append({"loc": "scheduler.name",
                       "msg": "mo-asha ranks several objectives; use asha for one"})
    if sampler == "grid":
        for name, param in spec.search_space.items():
            if isinstance(param, FloatParam) and param.step is None:
                errors.append({"loc": f"search_space.{name}.step",
                               "msg": "the grid sampler needs a step (or use categorical)"})
        if not spec.search_space:
            errors.append({"loc": "search_space", "msg": "the grid sampler needs parameters"})
        size = grid_size(spec)
        if size is not None and size > MAX_GRID_SIZE:  # Optuna's GridSampler lists them all
            errors.append({"loc": "search_space",
                           "msg": f"the grid has {_count(size)} points, more than the grid "
                                  f"sampler's {MAX_GRID_SIZE:,}: use larger steps or another "
                                  "sampler"})
    if scheduler in POPULATION_SCHEDULERS and not spec.search_space:
        errors.append({"loc": "search_space", "msg": "PBT needs parameters to mutate"})
    if scheduler in POPULATION_SCHEDULERS:
        errors += _check_mutable_in_training(spec, task_cls)
        if spec.search_space and all(isinstance(p, CategoricalParam) and len(p.choices) == 1
                                     for p in spec.search_space.values()):
            # numeric parameters always hold two values or more (high > low, steps divide)
            errors.append({"loc": "search_space",
                           "msg": f"{scheduler} needs a parameter with two values or more to "
                                  "mutate; every parameter here has one"})
    if spec.budget.stop_when is not None:
        if spec.is_multi_objective:
            errors.append({"loc": "budget.stop_when",
                           "msg": "study-level stopping needs one objective"})
        if scheduler in POPULATION_SCHEDULERS:
            errors.append({"loc": "budget.stop_when",
                           "msg": f"{scheduler} trains its population together and starts "
                                  "no trial later that a rule could hold back; use "
                                  "budget.timeout_s"})
    if scheduler == "pb2":
        for name, param in spec.search_space.items():
            if isinstance(param, CategoricalParam):
                errors.append({"loc": f"search_space.{name}.type",
                               "msg": "PB2 explores numeric parameters only; use pbt"})
    return errors


# TrainConfig fields a running trial can change from one checkpoint to the next (PBT's
# exploit resumes the donor's checkpoint with new values); the optimizer type, EMA on/off
# and model shapes cannot change that way.
MUTABLE_IN_TRAINING = {"lr", "weight_decay", "momentum", "adam_beta1", "adam_beta2",
                       "max_grad_norm", "min_lr_ratio", "warmup_steps", "micro_batch_size",
                       "grad_accum_steps", "ema_decay", "eval_with_ema", "precision"}


def _check_mutable_in_training(spec: StudySpec, task_cls: type[trainers.Task]) -> list[dict]:
    allowed = MUTABLE_IN_TRAINING | set(task_cls.mutable_options)
    errors = []
    for name, param in spec.search_space.items():
        ema_on_off = isinstance(param, CategoricalParam) and None in param.choices
        if name not in allowed or ema_on_off:  # EMA state cannot appear or vanish on resume
            errors.append({"loc": f"search_space.{name}",
                           "msg": f"PBT changes hyperparameters while a trial trains; {name} "
                                  f"cannot change mid-training (it may: "
                                  f"{', '.join(sorted(allowed))})"})
    return errors
