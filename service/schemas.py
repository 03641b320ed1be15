"""Request and response bodies of the REST API (pydantic), apart from the storage models.

Floats that are NaN or infinite (a diverged trial's intermediate values) are
written as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``: JSON has
no such numbers, and optuna-dashboard#108 shows what a bare ``Infinity`` does
to a JSON client.

Every datetime is written in UTC with its offset (``...Z``). Optuna's trials carry
naive datetimes of this machine's local clock (Optuna 5 stores UTC and converts
to local time when it reads; ``service.optuna_sql`` does the same); the
service's own tables give aware UTC ones.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Annotated, Any, Generic, TypeVar

from optuna.trial import FrozenTrial
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from hpo.errors import public_message
from service.studies import StudyView

T = TypeVar("T")


def as_utc(value: dt.datetime) -> dt.datetime:
    """``value`` in UTC; a naive one is read as this machine's local time (Optuna's trials)."""
    return value.astimezone(dt.UTC)


UTCDatetime = Annotated[dt.datetime, AfterValidator(as_utc)]


class _Out(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="strings")


class ErrorDetail(_Out):
    loc: str = Field(description="dotted path of the offending field ('' for the whole body)")
    msg: str


class ErrorInfo(_Out):
    code: str = Field(description="stable machine-readable code, e.g. invalid_spec")
    message: str
    details: list[ErrorDetail] = []


class ErrorBody(_Out):
    """The one shape of every error answer."""

    error: ErrorInfo


class Page(_Out, Generic[T]):
    items: list[T]
    total: int = Field(description="items in the whole collection")
    offset: int
    limit: int


class Counts(_Out):
    complete: int
    pruned: int
    failed: int = Field(description="FAIL trials, requeued ones included")
    running: int
    waiting: int
    requeued: int = Field(description="FAIL trials of a lost driver, run again (not budget)")


class Progress(_Out):
    finished: int = Field(description="trials COMPLETE, PRUNED or FAIL, less requeued ones")
    n_trials: int = Field(description="the study's budget of finished trials")
    fraction: float = Field(description="finished / n_trials, in [0, 1]")


# Recorded for the service's own use, left out of every answer but an admin's dashboard:
# "checkpoint", a server path, for the driver that resumes the trial; "node_ip", the
# internal address of the Ray node the trial ran on (Tune's result field). "node_id", an
# opaque Ray id, stays: it tells which trials shared a node, an admin maps it to a machine.
HIDDEN_TRIAL_ATTRS = {"checkpoint", "node_ip"}


def public_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    """A trial's user attributes fit for an answer: no server path, no traceback (issue 11;
    trials recorded before errors were kept as one line still hold a traceback)."""
    out = {k: v for k, v in attrs.items() if k not in HIDDEN_TRIAL_ATTRS}
    if isinstance(out.get("fail_reason"), str):
        out["fail_reason"] = public_message(out["fail_reason"])
    return out


class TrialOut(_Out):
    number: int
    state: str = Field(description="RUNNING, COMPLETE, PRUNED, FAIL or WAITING")
    value: float | None = Field(description="the objective (first objective if several)")
    values: list[float] | None
    params: dict[str, Any]
    user_attrs: dict[str, Any] = Field(description="stopped_by, device_seconds, fail_reason, ...")
    constraints: dict[str, float] | None = Field(
        None, description="spec constraints, as Optuna records them: <= 0 where the bound "
                          "holds, else by how much it is exceeded; null before they are known")
    feasible: bool | None = Field(None, description="every constraint holds; null without "
                                                    "constraints")
    datetime_start: UTCDatetime | None
    datetime_complete: UTCDatetime | None
    duration_s: float | None
    intermediate_values: dict[int, float] | None = Field(
        None, description="step (optimizer updates) -> objective; only with ?intermediate=true")

    @classmethod
    def of(cls, trial: FrozenTrial, intermediate: bool = False) -> TrialOut:
        duration = trial.duration.total_seconds() if trial.duration is not None else None
        constraints = trial.constraints
        return cls(number=trial.number, state=trial.state.name,
                   value=trial.values[0] if trial.values else None, values=trial.values,
                   params=trial.params, user_attrs=public_attrs(trial.user_attrs),
                   constraints=constraints or None,
                   feasible=all(v <= 0 for v in constraints.values()) if constraints else None,
                   datetime_start=trial.datetime_start, datetime_complete=trial.datetime_complete,
                   duration_s=duration,
                   intermediate_values=dict(trial.intermediate_values) if intermediate else None)


class StudySummary(_Out):
    name: str
    status: str = Field(description="QUEUED, RUNNING, COMPLETED, STOPPED or FAILED")
    owner: str | None
    task: str
    n_trials: int
    counts: Counts
    progress: Progress
    stop_requested: bool
    created_at: UTCDatetime
    started_at: UTCDatetime | None
    ended_at: UTCDatetime | None
    error: str | None
    waiting_for: str | None = Field(None, description="the quota the study waits for, while "
                                                      "its owner is over it (QUEUED or RUNNING)")
    stop_reason: str | None = Field(None, description="the budget.stop_when rule that ended "
                                                      "the study (COMPLETED) before its budget")

    @classmethod
    def fields_of(cls, v: StudyView) -> dict[str, Any]:
        row, c = v.row, v.counts
        return dict(
            name=row.name, status=row.status, owner=v.owner, task=row.spec.get("task", ""),
            n_trials=row.n_trials,
            counts=Counts(complete=c.complete, pruned=c.pruned, failed=c.failed,
                          running=c.running, waiting=c.waiting, requeued=c.requeued),
            progress=Progress(finished=c.budget_used, n_trials=row.n_trials,
                              fraction=min(1.0, c.budget_used / row.n_trials)),
            stop_requested=row.stop_requested, created_at=row.created_at,
            started_at=row.started_at, ended_at=row.ended_at,
            error=public_message(row.error) if row.error else None,
            waiting_for=row.waiting_for, stop_reason=row.stop_reason)

    @classmethod
    def of(cls, v: StudyView) -> StudySummary:
        return cls(**cls.fields_of(v))


class QuotaLimitsOut(_Out):
    max_running_trials: int | None = Field(description="trials running at once; null: no limit")
    max_gpus: float | None = Field(description="GPUs held at once by running trials")
    device_seconds_per_day: float | None = Field(description="device-seconds per rolling 24 h")
    device_seconds_total: float | None = Field(description="device-seconds ever")


class QuotaUseOut(_Out):
    running_trials: int = Field(description="trials of all the owner's studies running now")
    gpus: float = Field(description="GPUs those trials hold")
    device_seconds_24h: float = Field(description="device-seconds in the last 24 h (finished "
                                                  "trials and running ones so far)")
    device_seconds_total: float = Field(description="device-seconds ever, likewise")


class QuotaOut(_Out):
    limits: QuotaLimitsOut
    use: QuotaUseOut

    @classmethod
    def of(cls, q) -> QuotaOut:
        """From a ``service.quotas.OwnerQuota``."""
        u = q.use
        return cls(limits=QuotaLimitsOut(**dataclasses.asdict(q.limits)),
                   use=QuotaUseOut(running_trials=u.running_trials, gpus=u.gpus,
                                   device_seconds_24h=round(u.device_seconds_24h, 3),
                                   device_seconds_total=round(u.device_seconds_total, 3)))


class StudyOut(StudySummary):
    spec: dict[str, Any]
    best_trial: TrialOut | None = Field(description="single objective: the best COMPLETE trial")
    best_trials: list[TrialOut] = Field(description="the best trial, or the Pareto front")
    device_seconds: float = Field(description="CPU- or GPU-seconds held by the trials so far")
    attempts: int = Field(description="times a driver started on this study")
    dashboard_url: str | None = Field(description="path of the study's dashboard page")
    quota: QuotaOut | None = Field(None, description="the owner's quota: limits and use now")

    @classmethod
    def of(cls, v: StudyView) -> StudyOut:
        best = [TrialOut.of(t) for t in v.best]
        objective = v.row.spec.get("objective")
        several = isinstance(objective, list) and len(objective) > 1  # a front of one is
        return cls(**cls.fields_of(v), spec=v.row.spec,       # no best trial (helper-35)
                   best_trial=best[0] if len(best) == 1 and not several else None,
                   best_trials=best,
                   device_seconds=round(v.device_seconds, 3), attempts=v.row.attempts,
                   dashboard_url=(f"/dashboard/studies/{v.optuna_id}"
                                  if v.optuna_id is not None else None),
                   quota=QuotaOut.of(v.quota) if v.quota is not None else None)


class FieldOut(_Out):
    name: str
    kind: str = Field(description="int, float, bool, str or choice")
    default: Any
    help: str
    nullable: bool
    choices: list[Any] | None


class TaskOut(_Out):
    name: str
    objective: str | None = Field(description="the metric optimized by default")
    metrics: dict[str, str] = Field(description="metric -> minimize | maximize")
    options: list[FieldOut] = Field(description="the task's own options")
    error: str | None = Field(None, description="why the task could not be loaded")


class TasksOut(_Out):
    training_fields: list[FieldOut] = Field(description="TrainConfig fields every task accepts")
    tasks: list[TaskOut]


class Health(_Out):
    status: str
    checks: dict[str, str] = {}
