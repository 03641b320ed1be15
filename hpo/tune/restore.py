"""What a new driver of a study restores of its scheduler (a restart of ``hpo run``, the
service's recovery after a kill): Ray's schedulers, and mo-asha, keep their state in the
driver's memory, so a new driver's first trial at each rung went on whatever it scored.

Refilled from the stored study where the rule can be replayed: ASHA's rungs
(:func:`restore_asha`; with several brackets, each trial's in the bracket its
``asha_bracket`` attribute names) and the median rule's results (:func:`restore_median`;
without ``hard_stop``, a stopped trial's up to the step its ``median_stopped_at`` attribute
names), from the trials' intermediate values (:func:`stored_curves`); mo-asha's from each
trial's ``mo_rungs`` attribute (:func:`stored_rungs`,
``hpo.tune.mo_asha.MoRungs.restore``). Hyperband starts empty. Ray's private state is
reached through ``hpo.ray_private`` (``asha_rungs``, ``median_results``,
``median_stopped``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import optuna
from optuna.trial import TrialState
from ray.tune.schedulers import AsyncHyperBandScheduler, MedianStoppingRule

from hpo.ray_private import asha_brackets, asha_rungs, median_results, median_stopped
from hpo.record import (
    ASHA_BRACKET_ATTR,
    MEDIAN_STOPPED_ATTR,
    MO_RUNGS_ATTR,
    StudyRecord,
    natural,
)
from trainers.checkpoint import META_FILE
from trainers.data import read_json

EXPERIMENT_STOPS = ("user", "timeout")  # stopped_by of trials the whole run's stop ended


def stored_curves(record: StudyRecord) -> list[tuple[int, dict[int, float], bool]]:
    """Each trial's intermediate values (``(number, {step: value}, ended)``, trials with
    any), from which a new driver's ASHA and median rule are refilled
    (:func:`restore_asha`). ``ended``: Tune gave its scheduler the
    trial's end (``on_trial_complete``): COMPLETE, or PRUNED by the scheduler; not a
    trial ended by the experiment's stop (``stopped_by`` user or timeout: Tune's
    clean-up stops those without telling the scheduler), FAIL, or still RUNNING.

    Called after the orphans are settled (``hpo.tune.driver.plan_trials``). Left out:
    a requeued trial (its parameters run again as a new trial, which the rungs meet
    as such). A trial still RUNNING, which this driver resumes from its checkpoint,
    keeps only its values up to the checkpoint's step: it reports the later steps
    again and is judged on them anew (kept, Ray judged them at a lower rung).
    """
    def ended(t: optuna.trial.FrozenTrial) -> bool:
        return t.state == TrialState.COMPLETE or (
            t.state == TrialState.PRUNED
            and t.user_attrs.get("stopped_by") not in EXPERIMENT_STOPS)

    out = []
    for t in record.study.get_trials(deepcopy=False):
        if not t.intermediate_values or t.user_attrs.get("requeued"):
            continue
        curve = dict(t.intermediate_values)
        if t.state == TrialState.RUNNING:
            resumed_at = checkpoint_step(t.user_attrs.get("checkpoint"))
            if resumed_at is None:
                continue
            curve = {step: v for step, v in curve.items() if step <= resumed_at}
        out.append((t.number, curve, ended(t)))
    return out


def stored_rungs(record: StudyRecord) -> list[tuple[int, float, list[float], bool]]:
    """Every vector kept by ``StudyRecord.rung_recorded``, as ``(number, milestone, values,
    went_on)`` (a trial's malformed entry is skipped; a requeued trial's are left out). A
    resumed trial keeps its vectors past its checkpoint: mo-asha judges a trial once
    at the highest rung a report reaches, so its reports again are let on, as they
    were; one whose entry says the rule stopped it is stopped again."""
    out = []
    for trial in record.study.get_trials(deepcopy=False):
        if trial.user_attrs.get("requeued"):  # runs again as a new trial
            continue
        for entry in trial.user_attrs.get(MO_RUNGS_ATTR) or []:
            if isinstance(entry, list) and len(entry) in (2, 3) and isinstance(
                    entry[0], (int, float)) and isinstance(entry[1], list) and (
                    len(entry) == 2 or entry[2] == "stopped"):
                out.append((trial.number, float(entry[0]), entry[1], len(entry) == 2))
    return out


def stored_brackets(record: StudyRecord) -> dict[int, int]:
    """The ASHA bracket each trial was drawn into (Optuna number -> bracket), from the
    ``asha_bracket`` attribute ``StudyRecord.asha_bracket`` keeps (several brackets only)."""
    return _stored_naturals(record, ASHA_BRACKET_ATTR)


def stored_median_stops(record: StudyRecord) -> dict[int, int]:
    """The step the median rule without ``hard_stop`` stopped judging each trial at
    (Optuna number -> step), from the ``median_stopped_at`` attribute
    ``StudyRecord.median_stopped`` keeps."""
    return _stored_naturals(record, MEDIAN_STOPPED_ATTR)


def _stored_naturals(record: StudyRecord, attr: str) -> dict[int, int]:
    out = {}  # (Optuna number -> the attribute, an int >= 0; a malformed one is left out)
    for trial in record.study.get_trials(deepcopy=False):
        if (value := natural(trial.user_attrs.get(attr))) is not None:
            out[trial.number] = value
    return out


def checkpoint_step(path: str | None) -> int | None:
    """The optimizer step of the trial checkpoint at ``path`` (its ``meta.json``, as
    ``trainers`` writes it), or ``None`` when there is none to read."""
    if not path:
        return None
    try:
        return int(read_json(Path(path) / META_FILE)["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def restored_key(number: int | str) -> str:
    """The rung key of a trial a previous driver ran (Optuna trial ``number``), until a
    Tune trial resuming it takes it over (:func:`rekey_asha`)."""
    return f"optuna-trial-{number}"


def restore_asha(scheduler: AsyncHyperBandScheduler, max_t: float,
                 curves: Iterable[tuple[int, Mapping[int, float], bool]], sign: float,
                 brackets: Mapping[int, int] | None = None) -> int:
    """Fill a new driver's ASHA with what the study's earlier drivers recorded at its
    rungs, from each trial's intermediate values (``curves``: Optuna number,
    ``{step: value}``, whether the trial ended COMPLETE or PRUNED; ``sign`` +1 maximizing,
    -1 minimizing, as Ray's ``metric_op``). With several brackets, a trial's values go to
    its bracket in ``brackets`` (Optuna number -> bracket, :func:`stored_brackets`); a
    trial with none there (stored before brackets were kept) is left out.

    Each trial's reports are replayed through Ray's rule (``_Bracket.on_result``): at a
    report, the highest rung at or below its step where the trial is not recorded yet
    takes its value (a report at or past ``max_t`` is not judged), and an ended trial's
    last report is replayed once more, as Ray's ``on_trial_complete`` does (it may then
    be recorded at a lower rung too). What a trial recorded depends on its own reports
    alone, and a decision reads the whole rung, so their order does not matter. Before,
    a new driver (a restart, the service's recovery) started with empty rungs: its first
    trial at each rung went on whatever it scored. Returns the values put back.
    """
    several = asha_brackets(scheduler) > 1
    restored = 0

    def replay(rungs: list[tuple[float, dict]], key: str, step: int, value: float) -> None:
        nonlocal restored
        for milestone, recorded in rungs:
            if step < milestone or key in recorded:
                continue
            recorded[key] = sign * value
            restored += 1
            return

    for number, curve, ended in curves:
        bracket = (brackets or {}).get(number) if several else 0
        if bracket is None or bracket >= asha_brackets(scheduler):
            continue
        rungs = asha_rungs(scheduler, bracket)
        key, steps = restored_key(number), sorted(curve)
        for step in steps:
            if step < max_t:
                replay(rungs, key, step, curve[step])
        if ended and steps:
            replay(rungs, key, steps[-1], curve[steps[-1]])
    return restored


def restore_median(scheduler: MedianStoppingRule, time_attr: str, metric: str,
                   curves: Iterable[tuple[int, Mapping[int, float], bool]],
                   stopped_at: Mapping[int, int] | None = None) -> int:
    """Fill a new driver's median stopping rule with the study's earlier results, from
    each trial's intermediate values (``curves`` as :func:`restore_asha` takes them): every
    report in order, as Ray's ``on_trial_result`` appends them, and an ended trial's last
    one once more, as its ``on_trial_complete`` does. Before, a new driver's rule had no
    other trial's running mean: every trial went on until ``min_samples_required`` trials
    of its own run had reported.

    Without ``hard_stop``, a trial the rule stopped is paused and runs on later, unjudged,
    and Ray leaves its later reports out of the means: ``stopped_at`` (Optuna number ->
    the step of the stop, :func:`stored_median_stops`) cuts its results there, and it is
    put back among the stopped (where its restored curve holds that step: resumed from a
    checkpoint before it, the trial is judged there again). Returns the trials put back."""
    results, stopped = median_results(scheduler), median_stopped(scheduler)
    restored = 0
    for number, curve, ended in curves:
        steps = sorted(curve)
        if not steps:
            continue
        at = (stopped_at or {}).get(number)
        judged = [step for step in steps if at is None or step <= at]
        reports = [{time_attr: step, metric: curve[step]} for step in judged]
        if ended:
            reports.append({time_attr: steps[-1], metric: curve[steps[-1]]})
        results[restored_key(number)] = reports
        if at is not None and at in curve:
            stopped.add(restored_key(number))
        restored += 1
    return restored


def rekey_asha(scheduler: AsyncHyperBandScheduler, old: str, new: str) -> None:
    """Give the values ``old`` recorded at an ASHA's rungs to ``new`` (a trial resumed by a
    new driver: judged again at a rung it passed, it could be stopped there)."""
    for bracket in range(asha_brackets(scheduler)):
        for _, recorded in asha_rungs(scheduler, bracket):
            if old in recorded:
                recorded[new] = recorded.pop(old)


def rekey_median(scheduler: MedianStoppingRule, old: str, trial) -> bool:
    """Give the results ``old`` had in a median rule, and its place among the stopped, to
    the Tune ``trial`` resuming it; whether it had any results (its first report then goes
    through :func:`drop_restored_repeat`)."""
    results, stopped = median_results(scheduler), median_stopped(scheduler)
    if old in stopped:
        stopped.discard(old)
        stopped.add(trial)
    if old in results:
        results[trial] = results.pop(old)
        return True
    return False


def drop_restored_repeat(scheduler: MedianStoppingRule, trial, result: Mapping,
                         time_attr: str) -> None:
    """Before the median rule takes a resumed ``trial``'s first ``result``: where it is a
    report of the restored last step again, the restored copy gives way. A trial resumed
    with nothing left to train (its checkpoint at its last evaluation) reports that
    evaluation again (``trainers.loop``: the new driver needs a final result); the rule
    held it once more than one driver does (three times with its end, where an
    uninterrupted trial's running mean holds it twice). A stopped trial's reports are not
    taken (``hard_stop: false``): nothing gives way."""
    if trial in median_stopped(scheduler):
        return
    held = median_results(scheduler).get(trial)
    if held and time_attr in result and held[-1].get(time_attr) == result[time_attr]:
        held.pop()
