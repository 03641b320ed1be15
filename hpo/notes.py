"""The study's dashboard note: its spec in readable Markdown, and how it ended (issue 16.1).

optuna-dashboard shows a study's note (``optuna_dashboard.save_note``) at the top of
the study page. :func:`study_note` writes it from the spec: the task, the owner, the
objective(s), a table of the search space, the sampler and its seed, the scheduler and
its parameters, the budget, the resources per trial and the warm-start sources; and,
once the study has ended, its status and its best trial (or the size of its Pareto
front). :func:`save_study_note` stores it.

The note is written by the study's driver when it starts (``hpo.tune.driver.run_study``)
and again when it ends, not by the service's create: ``save_note`` costs about six
statements (it reads the study's system attributes twice and writes a version and one
attribute per 2,045 characters), and the create answers from a handful.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from pydantic import BaseModel

from hpo.params import CategoricalParam, FloatParam, IntParam
from hpo.spec import POPULATION_SCHEDULERS, StudySpec

log = logging.getLogger(__name__)

MAX_TABLE_ROWS = 100  # rows of the search-space and config tables; the rest are counted
MAX_CELL_CHARS = 200


@dataclasses.dataclass(frozen=True)
class NoteEnd:
    """How a study ended, for its note.

    ``status``: ``COMPLETED``, ``STOPPED``, ``FAILED`` or ``INTERRUPTED``; ``best``: the
    best trial as ``(number, value, params)`` (single objective); ``n_pareto``: the
    size of the Pareto front (multi-objective); ``error``: one line (a ``FAILED`` study).
    """

    status: str
    n_complete: int | None = None  # None: not counted (a driver that failed early)
    n_pruned: int = 0
    n_failed: int = 0
    best: tuple[int, float, Mapping[str, Any]] | None = None
    n_pareto: int | None = None
    error: str | None = None
    stop_reason: str | None = None  # the budget.stop_when rule that ended it (hpo.stopping)


def cell(value: Any) -> str:
    """``value`` as the text of one Markdown table cell: one line, ``|`` and HTML escaped,
    at most ``MAX_CELL_CHARS`` characters."""
    text = value if isinstance(value, str) else _fmt(value)
    text = " ".join(text.split()).replace("\\", "\\\\").replace("|", "\\|")
    text = text.replace("<", "&lt;").replace(">", "&gt;")
    return text if len(text) <= MAX_CELL_CHARS else text[:MAX_CELL_CHARS - 1] + "…"


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _options(model: Any, skip: Sequence[str] = ("name",)) -> str:
    """A spec model's options as ``key=value, ...`` (nested models likewise); options left
    unset (``None``: their default, e.g. ASHA's ``max_t``, the trials' planned updates)
    are left out."""
    parts = []
    for key, value in model:
        if key in skip or value is None:
            continue
        if isinstance(value, BaseModel):
            value = f"{value.name}({_options(value)})"
        parts.append(f"{key}={_fmt(value)}")
    return ", ".join(parts)


def space_rows(spec: StudySpec) -> list[str]:
    """The search-space table: a header, then one row per parameter (name, kind, low,
    high, log, step, choices), empty cells where a field does not apply."""
    rows = ["| name | kind | low | high | log | step | choices |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for i, (name, p) in enumerate(spec.search_space.items()):
        if i == MAX_TABLE_ROWS:
            rows.append(f"| … and {len(spec.search_space) - i} more | | | | | | |")
            break
        if isinstance(p, CategoricalParam):
            fields = ["categorical", "", "", "", "", ", ".join(_fmt(c) for c in p.choices)]
        else:
            step = p.step if isinstance(p, IntParam | FloatParam) else None
            fields = [p.type, _fmt(p.low), _fmt(p.high), "yes" if p.log else "no",
                      "" if step is None else _fmt(step), ""]
        rows.append("| " + " | ".join(cell(x) for x in [f"`{name}`", *fields]) + " |")
    return rows


def _sampler(spec: StudySpec) -> str:
    s = spec.sampler
    if spec.scheduler.name in POPULATION_SCHEDULERS:
        return f"Ray's variant generator (the population of {spec.scheduler.name}), seed " \
               f"{_fmt(s.seed)}"
    if s.name == "tpe":  # what runs: the start-up trials the budget's when left unset
        s = s.model_copy(update={"n_startup_trials": s.startup_trials(spec.budget.n_trials),
                                 "multivariate": s.is_multivariate})
    rest = _options(s, skip=("name", "seed"))
    return f"{s.name}, seed {_fmt(s.seed)}" + (f" ({rest})" if rest else "")


def _scheduler(spec: StudySpec) -> str:
    s = spec.scheduler
    rest = _options(s)
    return s.name + (f" ({rest})" if rest else "")


def _budget(spec: StudySpec) -> str:
    b = spec.budget
    text = f"{b.n_trials} trials, at most {b.max_concurrent_trials} at a time"
    if b.timeout_s is not None:
        text += f", time budget {_fmt(b.timeout_s)} s"
    if b.stop_when is not None:
        text += f", stop when {_options(b.stop_when, skip=())}"
    return text + (f", up to {spec.max_failures} retries per trial" if spec.max_failures else "")


def _constraints(spec: StudySpec) -> str:
    return ", ".join(f"`{c.metric}` ≤ {_fmt(c.max)}" if c.max is not None
                     else f"`{c.metric}` ≥ {_fmt(c.min)}" for c in spec.constraints)


def _resources(spec: StudySpec) -> str:
    r = spec.resources
    text = f"{_fmt(r.cpus)} CPU, {_fmt(r.gpus)} GPU per worker, {r.workers} " \
           f"worker{'s' if r.workers != 1 else ''}"
    if r.custom:
        text += ", " + ", ".join(f"{k}: {_fmt(v)}" for k, v in r.custom.items())
    return text


def _warm_start(spec: StudySpec) -> str:
    parts = []
    for entry in spec.warm_start:
        if hasattr(entry, "study"):
            parts.append(f"study {entry.study} (top {entry.top_k})")
    n_points = len(spec.warm_start) - len(parts)
    if n_points:
        parts.append(f"{n_points} point{'s' if n_points != 1 else ''}")
    return "; ".join(parts) or "none"


def _objectives(spec: StudySpec) -> str:
    text = ", ".join(f"`{o.metric}` ({o.direction})" for o in spec.objectives)
    return text + (", the best reported value" if spec.objective_reduce == "best" else "")


def end_lines(end: NoteEnd, spec: StudySpec) -> list[str]:
    """The note's ``Outcome`` section for a study that ended."""
    counted = "" if end.n_complete is None else (
        f": {end.n_complete} complete, {end.n_pruned} pruned, {end.n_failed} failed")
    lines = ["## Outcome", "", f"**{end.status}**{counted}."]
    if end.error:
        lines += ["", f"Error: {cell(end.error)}"]
    if end.stop_reason:
        lines += ["", f"Stopped early: {cell(end.stop_reason)}"]
    if end.best is not None:
        number, value, params = end.best
        metric = spec.objectives[0].metric
        lines += ["", f"Best trial: **{number}**, `{metric}` = {_fmt(float(value))}", "",
                  "| parameter | value |", "| --- | --- |",
                  *(f"| `{cell(k)}` | {cell(v)} |" for k, v in params.items())]
    elif end.n_pareto is not None:
        lines += ["", f"Pareto front: **{end.n_pareto}** trial"
                      f"{'s' if end.n_pareto != 1 else ''}"]
    elif end.status != "FAILED":
        lines += ["", "No complete and feasible trial: every complete trial breaks a "
                      "constraint." if end.n_complete and spec.constraints else
                      "No trial completed."]
    return lines


def study_note(spec: StudySpec, owner: str | None = None, end: NoteEnd | None = None,
               status: str = "RUNNING") -> str:
    """The study's note in Markdown: its spec as tables, and ``end`` once it has ended
    (``status`` shows until then)."""
    lines = [f"# {cell(spec.name)}", "",
             "| | |", "| --- | --- |",
             f"| task | `{cell(spec.task)}` |"]
    if owner:
        lines.append(f"| owner | {cell(owner)} |")
    lines += [f"| objective | {cell(_objectives(spec))} |",
              f"| sampler | {cell(_sampler(spec))} |",
              f"| scheduler | {cell(_scheduler(spec))} |",
              f"| budget | {cell(_budget(spec))} |",
              f"| resources per trial | {cell(_resources(spec))} |",
              f"| warm start | {cell(_warm_start(spec))} |",
              *([f"| constraints | {cell(_constraints(spec))} |"] if spec.constraints else []),
              ""]
    lines += ["## Search space", "", *space_rows(spec), ""]
    if spec.config:
        lines += ["## Fixed config", "", "| key | value |", "| --- | --- |"]
        items = list(spec.config.items())
        lines += [f"| `{cell(k)}` | {cell(v)} |" for k, v in items[:MAX_TABLE_ROWS]]
        if len(items) > MAX_TABLE_ROWS:
            lines.append(f"| … and {len(items) - MAX_TABLE_ROWS} more | |")
        lines.append("")
    lines += end_lines(end, spec) if end is not None else [f"Status: **{status}**"]
    return "\n".join(lines) + "\n"


def save_study_note(study: optuna.Study, spec: StudySpec, owner: str | None = None,
                    end: NoteEnd | None = None) -> bool:
    """Store :func:`study_note` as the study's dashboard note; whether it was stored.

    A failure to write the note is logged, never raised: the note is for people, and
    the study goes on without it.
    """
    from optuna_dashboard import save_note

    try:
        save_note(study, study_note(spec, owner, end))
    except Exception:  # noqa: BLE001 - a note never breaks a study
        log.exception("cannot write the dashboard note of study %s", spec.name)
        return False
    return True
