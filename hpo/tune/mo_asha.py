"""Multi-objective asynchronous successive halving (MO-ASHA) for Ray Tune (issue 18.1).

Schmucker, Donini, Zafar, Salinas and Archambeau, 2021, "Multi-objective
Asynchronous Successive Halving" (arXiv:2106.12639): ASHA's rungs, with the
single-objective ranking at a rung replaced by a multi-objective one. Of the
rankings the paper studies, this is the NSGA-II one (Deb et al., 2002):
non-dominated sorting, then crowding distance inside a front. Ray's ASHA
(``AsyncHyperBandScheduler``) is its stopping variant, and so is this: a trial
is judged when it reaches a rung and stopped there or let on, never paused.

:class:`MoRungs` is the algorithm (no Ray); :class:`MultiObjectiveASHA` answers
Tune's events with it. Optuna stores intermediate values for one objective only,
so the objectives are read from each result itself, never from the storage; each
vector recorded at a rung is kept in its trial's user attribute ``mo_rungs``
(``StudyRecord.rung_recorded``), from which a restarted driver's rungs are put back
(:meth:`MoRungs.restore`): without them its first trial at each rung went on whatever
it scored.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence

import numpy as np
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from hpo.pareto import nondomination_ranks


def crowding_distance(losses: np.ndarray) -> np.ndarray:
    """NSGA-II's crowding distance of each row of one front (Deb et al., 2002, section III-B).

    Per objective, the rows are sorted by value (ties keep row order); the first
    and the last get ``inf``, each other row adds the gap between its two
    neighbours divided by the objective's range (last minus first). An objective
    whose values are all equal adds nothing. Finite values whose range overflows float64
    (near +-1e308) are scaled first: before, the range was ``inf`` and every distance NaN.

    Args:
        losses: float array of shape ``(n_rows, n_objectives)``, finite.

    Returns:
        float array of shape ``(n_rows,)``, each ``>= 0`` or ``inf``.
    """
    n_rows, n_objectives = losses.shape
    distance = np.zeros(n_rows)
    for j in range(n_objectives):
        order = np.argsort(losses[:, j], kind="stable")
        v = losses[order, j]
        with np.errstate(over="ignore"):
            width = v[-1] - v[0]
        if not math.isfinite(width):  # finite values whose range overflows (1e308 - -1e308):
            v = v / np.abs(v).max()     # the distance is a ratio of gaps, so scale them first
            width = v[-1] - v[0]
        if width <= 0:
            continue
        distance[order[0]] = distance[order[-1]] = math.inf
        distance[order[1:-1]] += (v[2:] - v[:-2]) / width
    return distance


class MoRungs:
    """The rungs of one MO-ASHA bracket and the decision at each (no Ray).

    Rungs lie at ``grace_period * reduction_factor**k`` updates, ``k = 0, 1, ...``,
    below ``max_t`` (Ray's ASHA has the same; a trial at ``max_t`` is stopped
    there: it reached its budget).

    The rule at a rung. A trial is judged once per rung: at its first result whose
    updates reach the rung (the highest rung reached: a trial whose reports skip a
    rung is judged at the next one only). It is ranked with the ``n - 1``
    objective vectors recorded at the rung before it (``n`` vectors in all, its own
    included), each vector signed so that every objective is minimized:

    1. non-dominated sorting gives each vector its front (0 = the rung's Pareto
       front);
    2. inside the trial's front, the crowding distance (:func:`crowding_distance`,
       over that front's vectors) breaks the tie: the larger, the better;
    3. ``ahead`` = the recorded vectors in a better front, plus those of its own
       front with a strictly larger crowding distance.

    The trial continues if ``ahead < ceil(n / reduction_factor)`` (the top
    ``1/reduction_factor`` of the rung, rounded up, ties in its favour), and is
    stopped otherwise. Either way its vector is recorded at the rung. So the first
    trial at a rung continues, and a later one continues if fewer than
    ``ceil(n / reduction_factor)`` recorded vectors rank above it; with one
    objective this is ASHA's "top 1/eta" in rank form (Ray interpolates a
    percentile of the recorded values instead, ``numpy.nanpercentile``).

    A result without a finite value of every objective (missing, NaN, infinite)
    stops the trial and is not recorded.

    Args:
        grace_period: updates of the first rung, ``>= 1``.
        max_t: updates at which every trial stops, ``>= grace_period``.
        reduction_factor: eta, ``> 1``.
        directions: ``"minimize"`` or ``"maximize"`` per objective.

    Raises:
        ValueError: an argument out of its range.
    """

    def __init__(self, grace_period: int, max_t: int, reduction_factor: float,
                 directions: Sequence[str]) -> None:
        if not 1 <= grace_period <= max_t:
            raise ValueError(f"need 1 <= grace_period <= max_t, got {grace_period=}, {max_t=}")
        if not reduction_factor > 1:
            raise ValueError(f"reduction_factor must be > 1, got {reduction_factor=}")
        if not directions or any(d not in ("minimize", "maximize") for d in directions):
            raise ValueError(f"need 'minimize' or 'maximize' per objective, got {directions=}")
        self.max_t, self.reduction_factor = max_t, reduction_factor
        self.signs = np.array([1.0 if d == "minimize" else -1.0 for d in directions])
        self.milestones: list[float] = []
        milestone = float(grace_period)
        while milestone < max_t:
            self.milestones.append(milestone)
            milestone *= reduction_factor
        # per rung: trial key -> its signed objective vector, in the order recorded
        self.recorded: list[dict[Hashable, np.ndarray]] = [{} for _ in self.milestones]
        # told (key, milestone, raw values, whether the trial went on) of each vector
        # recorded (the study's record)
        self.on_record: Callable[[Hashable, float, list[float], bool], None] | None = None
        # trials a restored record says were stopped (their end was not stored: a trial
        # resumed by a new driver is stopped at its first result, as it was before)
        self.stopped: set[Hashable] = set()

    def restore(self, entries: Iterable[tuple[Hashable, float, Sequence[float], bool]]
                ) -> int:
        """Put back vectors recorded before (a driver restarted: ``(key, milestone, raw
        values, went_on)`` as :attr:`on_record` was told them), so that the rule goes on
        ranking against them; entries of a milestone this bracket lacks, or not finite, are
        skipped. The order does not matter: a decision ranks against the whole rung. A
        trial that did not go on is stopped at its next result (:attr:`stopped`: the
        driver that stopped it died before its end was stored; the breaker's suspicion).
        Returns how many were put back."""
        restored = 0
        for key, milestone, values, went_on in entries:
            if not went_on:
                self.stopped.add(key)
            index = next((i for i, m in enumerate(self.milestones)
                          if math.isclose(m, milestone)), None)
            if index is None or len(values) != len(self.signs) or key in self.recorded[index] \
                    or not all(isinstance(v, (int, float)) and math.isfinite(v)
                               for v in values):
                continue
            self.recorded[index][key] = self.signs * np.asarray(values, dtype=float)
            restored += 1
        return restored

    def decide(self, trial_id: Hashable, updates: float,
               values: Sequence[float] | None) -> bool:
        """Whether the trial continues after a result at ``updates`` optimizer updates.

        ``trial_id``: the trial's key (one per trial for the study's life: the record's
        Optuna trial number, so that a trial a new driver resumes is not judged twice).
        ``values``: the trial's objectives in the order of ``directions`` (raw, not
        signed), or None when one is missing.
        """
        if updates >= self.max_t or trial_id in self.stopped:
            return False
        if values is None or not all(math.isfinite(v) for v in values):
            return False
        index = self._rung(updates)
        if index is None or trial_id in self.recorded[index]:
            return True
        rung = self.recorded[index]
        loss = self.signs * np.asarray(values, dtype=float)
        keep = math.ceil((len(rung) + 1) / self.reduction_factor)
        went_on = self._ahead(np.array([*rung.values(), loss])) < keep
        rung[trial_id] = loss
        if self.on_record is not None:
            self.on_record(trial_id, self.milestones[index], [float(v) for v in values],
                           went_on)
        return went_on

    def _rung(self, updates: float) -> int | None:
        """The index of the highest rung at or below ``updates``, None below the first."""
        for index in reversed(range(len(self.milestones))):
            if updates >= self.milestones[index]:
                return index
        return None

    @staticmethod
    def _ahead(losses: np.ndarray) -> int:
        """How many rows rank strictly above the last row (the rule's step 3)."""
        fronts = nondomination_ranks(losses)
        own = fronts == fronts[-1]
        distance = crowding_distance(losses[own])
        return int(np.sum(fronts < fronts[-1]) + np.sum(distance[:-1] > distance[-1]))


class MultiObjectiveASHA(FIFOScheduler):
    """Ray Tune scheduler: MO-ASHA (:class:`MoRungs`) over the spec's objectives.

    Tune's ``metric`` and ``mode`` (the first objective's) are not used: every
    objective is read from each result by name. A result without ``time_attr`` is
    let on (it cannot be placed at a rung). Trials run first in, first out.

    Args:
        objectives: ``(metric, direction)`` per objective, ``direction``
            ``"minimize"`` or ``"maximize"``.
        time_attr: the result's budget key (``hpo.tune.schedulers.TIME_ATTR``).
        grace_period, max_t, reduction_factor: as :class:`MoRungs`.
        key: a Tune trial id to the trial's key at the rungs (default: the id itself;
            the study's record gives its Optuna trial number, which a trial keeps when
            a new driver resumes it).
    """

    def __init__(self, objectives: Sequence[tuple[str, str]], time_attr: str,
                 grace_period: int, max_t: int, reduction_factor: float,
                 key: Callable[[str], Hashable] | None = None) -> None:
        super().__init__()
        self.metrics = [m for m, _ in objectives]
        self.time_attr = time_attr
        self.rungs = MoRungs(grace_period, max_t, reduction_factor, [d for _, d in objectives])
        self.key = key or (lambda trial_id: trial_id)
        self.n_stopped = 0

    def _values(self, result: Mapping) -> list[float] | None:
        try:
            return [float(result[m]) for m in self.metrics]
        except (KeyError, TypeError, ValueError):
            return None

    def on_trial_result(self, tune_controller, trial, result) -> str:
        if self.time_attr not in result:
            return TrialScheduler.CONTINUE
        if self.rungs.decide(self.key(trial.trial_id), result[self.time_attr],
                             self._values(result)):
            return TrialScheduler.CONTINUE
        self.n_stopped += 1
        return TrialScheduler.STOP

    def on_trial_complete(self, tune_controller, trial, result) -> None:
        # as Ray's ASHA: a last result not seen by on_trial_result is recorded at its rung
        if result and self.time_attr in result:
            self.rungs.decide(self.key(trial.trial_id), result[self.time_attr],
                              self._values(result))

    def debug_string(self) -> str:
        sizes = ", ".join(f"{m:g}: {len(r)}" for m, r in
                          zip(self.rungs.milestones, self.rungs.recorded, strict=True))
        return f"Using MO-ASHA: n_stopped={self.n_stopped}; trials per rung {{{sizes}}}"
