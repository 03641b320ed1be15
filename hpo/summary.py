"""The study summary: what a read of a study shows, kept current as its trials change.

Trial counts by state, the best trial (one objective) or the Pareto front (several),
the budget used, and device-seconds. The driver keeps one :class:`SummaryTracker` as
the listener of its record (``hpo.record.StudyRecord``): it reads the study once when
the driver starts, follows every trial the record changes, and hands the current
:class:`StudySummary` to a ``write`` callback (the service stores it in a table of its
own, so that its reads of a study never scan the study's trials; issue 13, point 5).

The numbers are Optuna's: the best trial is ``Study.best_trial`` (feasible trials only
where the study has constraints; of equal values the lowest-numbered, :func:`best_single`),
the front is ``Study.best_trials`` (Optuna's own
non-dominated sort, ``hpo.storage.pareto_front_mask``), each without intermediate
values.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import distribution_to_json, json_to_distribution
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from hpo.storage import pareto_front_mask, trial_id_of

log = logging.getLogger(__name__)

REQUEUED_ATTR = "requeued"  # hpo.record: a FAIL trial of a lost driver, run again
DEVICE_SECONDS_ATTR = "device_seconds"  # hpo.record: a finished trial's wall time x devices


@dataclasses.dataclass(frozen=True)
class TrialCounts:
    """Trials of one study by state."""

    complete: int = 0
    pruned: int = 0
    failed: int = 0
    running: int = 0
    waiting: int = 0
    requeued: int = 0

    @property
    def finished(self) -> int:
        """Trials COMPLETE, PRUNED or FAIL (requeued ones included)."""
        return self.complete + self.pruned + self.failed

    @property
    def budget_used(self) -> int:
        """Finished trials that count against ``budget.n_trials``: not the FAIL trials a
        lost driver left and ``run_study`` requeued (user attribute ``requeued``)."""
        return self.finished - self.requeued

    @property
    def total(self) -> int:
        return self.finished + self.running + self.waiting


_COUNTED = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned",
            TrialState.FAIL: "failed", TrialState.RUNNING: "running",
            TrialState.WAITING: "waiting"}


@dataclasses.dataclass(frozen=True)
class StudySummary:
    """One study's summary; JSON-able (:meth:`to_json`, :meth:`from_json`).

    Attributes:
        optuna_study_id: the study's id in the Optuna storage.
        n_objectives: 1, or the number of objectives of a multi-objective study.
        counts: trials by state.
        best: the best trial, or the Pareto front by trial number (``[]`` before the
            first COMPLETE, feasible trial), as JSON-able dicts (:func:`trial_to_dict`).
        device_seconds_finished: the sum of the trials' ``device_seconds`` attributes
            (written as a trial ends), in seconds of one device held.
        running_since: the start (aware, UTC) of each RUNNING trial.
        devices_held: the devices (GPUs, else CPUs, times workers) one trial holds.
    """

    optuna_study_id: int | None
    n_objectives: int
    counts: TrialCounts = TrialCounts()
    best: tuple[dict[str, Any], ...] = ()
    device_seconds_finished: float = 0.0
    running_since: tuple[dt.datetime, ...] = ()
    devices_held: float = 1.0

    def device_seconds(self, now: dt.datetime | None = None) -> float:
        """Device-seconds the study used so far, in seconds of one CPU (or GPU) held.

        The sum of the trials' ``device_seconds`` attribute, plus, for each RUNNING
        trial, the time since it started (never below 0) times ``devices_held``: an
        estimate until the trial ends (a RUNNING trial has no ``device_seconds`` yet:
        ``hpo.record`` writes it as the trial ends).

        Args:
            now: an aware datetime; default the current time.
        """
        now = now or dt.datetime.now(dt.UTC)
        running = sum(max(0.0, (now - start).total_seconds()) for start in self.running_since)
        return self.device_seconds_finished + running * self.devices_held

    def best_trials(self) -> list[FrozenTrial]:
        """The best trial or the Pareto front, as ``Study.best_trial(s)`` gives them
        (naive local datetimes), without intermediate values."""
        return [trial_from_dict(d) for d in self.best]

    @property
    def best_numbers(self) -> list[int]:
        """Numbers of the best trial or of the Pareto front's trials."""
        return [d["number"] for d in self.best]

    def to_json(self) -> str:
        """This summary as JSON text (Python's JSON: ``Infinity`` and ``NaN`` kept)."""
        data = dataclasses.asdict(self)
        data["running_since"] = [t.isoformat() for t in self.running_since]
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> StudySummary:
        """The summary :meth:`to_json` wrote.

        Raises:
            ValueError: ``text`` is not such a summary.
        """
        try:
            data = json.loads(text)
            return cls(optuna_study_id=data["optuna_study_id"],
                       n_objectives=int(data["n_objectives"]),
                       counts=TrialCounts(**data["counts"]), best=tuple(data["best"]),
                       device_seconds_finished=float(data["device_seconds_finished"]),
                       running_since=tuple(dt.datetime.fromisoformat(t)
                                           for t in data["running_since"]),
                       devices_held=float(data["devices_held"]))
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"not a study summary: {e!r}") from e


def trial_to_dict(trial: FrozenTrial) -> dict[str, Any]:
    """A finished trial as a JSON-able dict, without its intermediate values; datetimes
    in UTC (Optuna hands out naive local time)."""
    return {"number": trial.number, "trial_id": trial_id_of(trial), "state": trial.state.name,
            "values": trial.values, "params": trial.params,
            "distributions": {k: distribution_to_json(d)
                              for k, d in trial.distributions.items()},
            "user_attrs": trial.user_attrs, "system_attrs": trial.system_attrs,
            "datetime_start": _utc_text(trial.datetime_start),
            "datetime_complete": _utc_text(trial.datetime_complete)}


def trial_from_dict(data: dict[str, Any]) -> FrozenTrial:
    """The trial :func:`trial_to_dict` wrote, with naive local datetimes as Optuna's reads."""
    return FrozenTrial(
        number=data["number"], trial_id=data["trial_id"], state=TrialState[data["state"]],
        value=None, values=data["values"], params=data["params"],
        distributions={k: json_to_distribution(t) for k, t in data["distributions"].items()},
        user_attrs=data["user_attrs"], system_attrs=data["system_attrs"],
        intermediate_values={}, datetime_start=_local(data["datetime_start"]),
        datetime_complete=_local(data["datetime_complete"]))


def _utc_text(local: dt.datetime | None) -> str | None:
    return None if local is None else local.astimezone(dt.UTC).isoformat()


def _local(text: str | None) -> dt.datetime | None:
    return None if text is None else (
        dt.datetime.fromisoformat(text).astimezone().replace(tzinfo=None))


def devices_held(resources) -> float:
    """The devices one trial holds: its workers' GPUs, else CPUs, times the workers
    (``hpo.spec.Resources``)."""
    return (resources.gpus if resources.gpus > 0 else resources.cpus) * resources.workers


@dataclasses.dataclass(frozen=True)
class _Seen:
    """What the tracker keeps of one trial."""

    state: TrialState
    requeued: bool
    device_seconds: float
    running_since: dt.datetime | None


class SummaryTracker:
    """A study's summary kept current trial by trial (a ``StudyRecord`` listener).

    Args:
        directions: the study's directions (``StudyDirection`` or ``"minimize"`` /
            ``"maximize"``), one per objective.
        devices_held: devices one trial holds (:func:`devices_held`), > 0.
        trials: the study's trials as they are now (one read at the driver's start).
        optuna_study_id: the study's id in the Optuna storage.
        write: called with the current summary: at once, then after changes, at most
            once per ``min_interval_s`` (a change inside the interval is written when
            it ends), and by :meth:`flush`. An exception it raises is logged and the
            write tried again at the next change or flush.
        min_interval_s: seconds between two writes, >= 0.

    Thread-safe: writes after an interval come from a timer thread.
    """

    def __init__(self, directions: Sequence[StudyDirection | str], devices_held: float,
                 trials: Iterable[FrozenTrial] = (), *, optuna_study_id: int | None = None,
                 write: Callable[[StudySummary], None] | None = None,
                 min_interval_s: float = 1.0) -> None:
        if devices_held <= 0:
            raise ValueError(f"devices_held must be > 0, got {devices_held=}")
        if min_interval_s < 0:
            raise ValueError(f"min_interval_s must be >= 0, got {min_interval_s=}")
        self.maximize = [_maximize(d) for d in directions]
        self.devices_held = float(devices_held)
        self.optuna_study_id = optuna_study_id
        self.write = write
        self.min_interval_s = min_interval_s
        self._seen: dict[int, _Seen] = {}
        self._best: dict[int, FrozenTrial] = {}  # by number: the best trial, or the front
        self._lock = threading.RLock()
        self._dirty = True
        self._last_write = -float("inf")
        self._timer: threading.Timer | None = None
        trials = list(trials)
        for trial in trials:
            self._seen[trial.number] = _seen(trial)
        self._consider([t for t in trials if t.state == TrialState.COMPLETE])
        self._write_if_due()

    @classmethod
    def from_storage(cls, storage: optuna.storages.BaseStorage, study_name: str,
                     devices_held: float, **kwargs) -> SummaryTracker:
        """A tracker of the stored study ``study_name``: one read of its trials.

        Raises:
            KeyError: no study of that name.
        """
        study_id = storage.get_study_id_from_name(study_name)
        return cls(storage.get_study_directions(study_id), devices_held,
                   storage.get_all_trials(study_id, deepcopy=False), optuna_study_id=study_id,
                   **kwargs)

    # -- following the trials ----------------------------------------------------------

    def trial_changed(self, trial: FrozenTrial) -> None:
        """Take ``trial`` as stored now (a new trial, or a change of one already seen)."""
        with self._lock:
            seen = _seen(trial)
            if self._seen.get(trial.number) == seen:
                return
            self._seen[trial.number] = seen
            if trial.state == TrialState.COMPLETE:
                self._consider([trial])
            self._dirty = True
            self._write_if_due()

    def summary(self) -> StudySummary:
        """The study's summary now."""
        with self._lock:
            counts: dict[str, int] = {}
            for s in self._seen.values():
                if s.state in _COUNTED:
                    counts[_COUNTED[s.state]] = counts.get(_COUNTED[s.state], 0) + 1
            counts["requeued"] = sum(s.requeued for s in self._seen.values())
            return StudySummary(
                optuna_study_id=self.optuna_study_id, n_objectives=len(self.maximize),
                counts=TrialCounts(**counts),
                best=tuple(trial_to_dict(self._best[n]) for n in sorted(self._best)),
                device_seconds_finished=sum(s.device_seconds for s in self._seen.values()),
                running_since=tuple(s.running_since for s in self._seen.values()
                                    if s.running_since is not None),
                devices_held=self.devices_held)

    def flush(self) -> None:
        """Write the summary now if it changed since the last write (the driver's end)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._dirty:
                self._write()

    close = flush

    # -- inside ------------------------------------------------------------------------

    def _consider(self, complete: list[FrozenTrial]) -> None:
        """Take COMPLETE trials into the best trial or the front."""
        fresh = [t for t in complete if t.number not in self._best]
        if fresh:
            self._best = {t.number: t for t in best_of([*self._best.values(), *fresh],
                                                       self.maximize)}

    def _write_if_due(self) -> None:
        if self.write is None or not self._dirty or self._timer is not None:
            return
        wait = self._last_write + self.min_interval_s - time.monotonic()
        if wait <= 0:
            self._write()
        else:
            self._timer = threading.Timer(wait, self._timed_write)
            self._timer.daemon = True
            self._timer.start()

    def _timed_write(self) -> None:
        with self._lock:
            self._timer = None
            if self._dirty:
                self._write()

    def _write(self) -> None:
        if self.write is None:
            return
        self._last_write = time.monotonic()
        try:
            self.write(self.summary())
            self._dirty = False
        except Exception:  # noqa: BLE001 - the summary never breaks the driver
            log.exception("writing the study summary failed; trying again at the next change")


def _maximize(direction: StudyDirection | str) -> bool:
    if isinstance(direction, StudyDirection):
        return direction == StudyDirection.MAXIMIZE
    if direction not in ("minimize", "maximize"):
        raise ValueError(f"a direction is 'minimize' or 'maximize', got {direction=}")
    return direction == "maximize"


def best_of(trials: Iterable[FrozenTrial], maximize: list[bool]) -> list[FrozenTrial]:
    """The best trial (one objective: :func:`best_single`) or the Pareto front, by number,
    of the COMPLETE, feasible ones among ``trials`` with a value for each objective
    (``maximize``: per objective, whether it is maximized); ``[]`` if there are none. The
    rule the summary, REST, the CLI and the dashboard's best trials all follow."""
    pool = sorted((t for t in trials if t.state == TrialState.COMPLETE and feasible(t)
                   and t.values is not None and len(t.values) == len(maximize)),
                  key=lambda t: t.number)
    if not pool:
        return []
    if len(maximize) == 1:
        return [best_single(pool, maximize[0])]
    losses = np.array([t.values for t in pool], dtype=float)
    losses[:, np.asarray(maximize)] *= -1
    return [t for t, keep in zip(pool, pareto_front_mask(losses), strict=True) if keep]


def best_single(trials: Iterable[FrozenTrial], maximize: bool) -> FrozenTrial | None:
    """The best of single-objective COMPLETE ``trials`` (their ``values[0]``; None if there
    are none), and of equal values the lowest-numbered: the trial that got there first, as
    ``Study.best_trial`` answers on Optuna's in-memory storage. On an RDB storage Optuna's
    query orders by value alone, so its pick among ties is the database's; one rule here
    keeps the REST answer, the CLI and the driver's outcome on the same trial whatever the
    order the trials ended in."""
    return min(trials, key=lambda t: best_order(t.values[0], t.number, maximize), default=None)


def best_order(value: float, number: int, maximize: bool) -> tuple[float, int]:
    """:func:`best_single`'s sort key of trial ``number`` with ``value``: the smaller the
    better (the better value, of equal values the lower number)."""
    return (-value if maximize else value, number)


def feasible(trial: FrozenTrial) -> bool:
    """Optuna's feasibility: every constraint value <= 0 (none: feasible)."""
    return all(c <= 0.0 for c in trial.constraints.values())


def _seen(trial: FrozenTrial) -> _Seen:
    used = trial.user_attrs.get(DEVICE_SECONDS_ATTR)
    numeric = isinstance(used, int | float) and not isinstance(used, bool)
    start = trial.datetime_start
    return _Seen(state=trial.state, requeued=REQUEUED_ATTR in trial.user_attrs,
                 device_seconds=float(used) if numeric else 0.0,
                 running_since=(start.astimezone(dt.UTC)
                                if trial.state == TrialState.RUNNING and start else None))
