"""A study's charts for the dashboard's study page, as plotly figures (issue 16.2).

Pure functions of the study's ``FrozenTrial`` s and its spec (no Ray, no storage):
:class:`hpo.board.StudyBoard` saves them with ``optuna_dashboard.save_plotly_graph_object``
under stable ids, so each write replaces the chart before.

What a browser test can count (the figure's layout title text starts with the words
given here):

* ``hpo-lineage`` (PBT and PB2), title "PBT lineage" / "PB2 lineage": one panel
  (subplot) per hyperparameter (the first ``MAX_PANELS``); in each, one trace per
  population member named ``trial N`` (``legendgroup`` ``trial N``, in the legend
  once), then one trace named ``exploits`` holding every exploit as a dotted edge.
  Members = traces named ``trial N`` on the first panel's axes (``xaxis`` ``x``) = the
  legend's ``trial N`` entries.
* ``hpo-rungs`` (ASHA, Hyperband, the median stopping rule, Optuna pruners), title
  "Rungs": bars ``reached`` (trials reaching each rung) and ``stopped here by X``, and
  markers ``stopped by X`` (each pruned trial at its budget).
* ``hpo-cost`` (every study), title "Cost": bars of device-seconds per trial by state,
  and ``best METRIC so far`` against the cumulative device-seconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import plotly.graph_objects as go
from optuna.trial import FrozenTrial, TrialState
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from hpo.params import CategoricalParam
from hpo.spec import POPULATION_SCHEDULERS, StudySpec

LINEAGE_ID, RUNGS_ID, COST_ID = "hpo-lineage", "hpo-rungs", "hpo-cost"
RUNG_SCHEDULERS = ("asha", "mo-asha", "hyperband", "median", "optuna-pruner")
MAX_RUNGS = 20  # budgets shown for a scheduler without rungs (its evaluation steps, thinned)
MAX_BRACKETS = 100  # brackets, and rungs per bracket, listed of a scheduler's rungs
MAX_PANELS = 6  # hyperparameters in the lineage chart (the search space's first), 450 px high
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
COLORS = qualitative.Plotly
# plotly's default template adds 6.5 kB to every figure's JSON (four more study
# attributes per write); the dashboard draws the figure on its own background. No figure
# sets a height: the dashboard draws each in a box 450 px high, half the page wide.
TEMPLATE = "none"


def study_figures(spec: StudySpec, trials: Sequence[FrozenTrial],
                  device_kind: str = "cpu") -> dict[str, go.Figure]:
    """The study's charts by graph object id: cost always, the lineage for PBT and PB2,
    the rungs for ASHA, Hyperband, the median rule and Optuna pruners."""
    figures = {COST_ID: cost_figure(spec, trials, device_kind)}
    if spec.scheduler.name in POPULATION_SCHEDULERS:
        figures[LINEAGE_ID] = lineage_figure(spec, trials)
    elif spec.scheduler.name in RUNG_SCHEDULERS:
        figures[RUNGS_ID] = rung_figure(spec, trials)
    return figures


def last_step(trial: FrozenTrial) -> int | None:
    """The optimizer updates a trial reached: its last intermediate value's step, else its
    ``budget_updates`` attribute (a pruned trial), else ``None``."""
    if trial.intermediate_values:
        return max(trial.intermediate_values)
    return trial.user_attrs.get("budget_updates")


# -- PBT lineage -------------------------------------------------------------------------


def schedule(trial: FrozenTrial, name: str) -> list[tuple[int, Any]]:
    """A PBT member's value of hyperparameter ``name`` over optimizer updates, as points
    ``(step, value)``: its first value at 0, each exploit at its step (the value held
    until then, the new one from then on), and its last value at :func:`last_step`.

    An exploit restarts the member from the donor's checkpoint at the donor's step,
    which may lie before the member's own: the line then goes back in steps.
    """
    points = [(0, trial.params.get(name))]
    for e in trial.user_attrs.get("exploits", []):
        step = points[-1][0] if e.get("step") is None else e["step"]
        points += [(step, e["old"].get(name, points[-1][1])), (step, e["new"].get(name))]
    end = last_step(trial)
    if end is not None and end != points[-1][0]:
        points.append((end, points[-1][1]))
    return points


def value_at(points: list[tuple[int, Any]], step: int) -> Any:
    """The value a :func:`schedule` held at ``step``: that of its last point at or before
    ``step`` (in the schedule's order), else its first."""
    held = points[0][1]
    for x, value in points:
        if x <= step:
            held = value
    return held


def lineage_figure(spec: StudySpec, trials: Sequence[FrozenTrial]) -> go.Figure:
    """Each member's hyperparameters over optimizer updates (one panel per hyperparameter,
    one trace ``trial N`` per member in each) and each exploit as a dotted edge from the
    donor's value to the receiver's new value at the exploit's step (trace ``exploits``).

    Exploits come from the trials' ``exploits`` attribute (``hpo.record``: ``donor_trial``,
    ``step``, ``old``, ``new``); one without a known donor has no edge.
    """
    names = list(spec.search_space)[:MAX_PANELS]
    members = sorted((t for t in trials if t.state != TrialState.WAITING),
                     key=lambda t: t.number)
    rows = max(1, len(names))
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, subplot_titles=names or None,
                        vertical_spacing=0.25 / rows)
    for row, name in enumerate(names, start=1):
        show = _shown(isinstance(spec.search_space[name], CategoricalParam))
        schedules = {t.number: schedule(t, name) for t in members}
        for i, t in enumerate(members):
            points = schedules[t.number]
            fig.add_trace(go.Scatter(
                x=[x for x, _ in points], y=[show(v) for _, v in points],
                mode="lines+markers", name=f"trial {t.number}",
                legendgroup=f"trial {t.number}", showlegend=row == 1,
                line={"color": COLORS[i % len(COLORS)]}), row=row, col=1)
        xs, ys, texts = exploit_edges(members, schedules, name)
        fig.add_trace(go.Scatter(
            x=xs, y=[show(v) for v in ys], text=texts, mode="lines+markers",
            name="exploits", legendgroup="exploits", showlegend=row == 1, hoverinfo="text",
            line={"color": "gray", "dash": "dot"}, marker={"symbol": "arrow-up"}),
            row=row, col=1)
        if getattr(spec.search_space[name], "log", False):
            fig.update_yaxes(type="log", row=row, col=1)
    fig.update_xaxes(title_text="optimizer updates", row=rows, col=1)
    more = len(spec.search_space) - len(names)
    fig.update_layout(template=TEMPLATE, title_text=(
        f"{spec.scheduler.name.upper()} lineage (dotted: exploits, donor → receiver)"
        + (f"; {more} more hyperparameters not shown" if more > 0 else "")))
    return fig


def exploit_edges(members: Sequence[FrozenTrial], schedules: dict[int, list[tuple[int, Any]]],
                  name: str) -> tuple[list, list, list]:
    """The exploits of ``members`` as edges of one panel, ``(xs, ys, texts)`` with ``None``
    between edges: at the exploit's step, from the donor's value of ``name`` then
    (:func:`value_at` its schedule) to the receiver's new value."""
    xs: list = []
    ys: list = []
    texts: list = []
    for t in members:
        for e in t.user_attrs.get("exploits", []):
            donor, step = e.get("donor_trial"), e.get("step")
            if donor not in schedules or step is None:
                continue
            text = f"trial {donor} → trial {t.number} at step {step}"
            xs += [step, step, None]
            ys += [value_at(schedules[donor], step), e["new"].get(name), None]
            texts += [text, text, None]
    return xs, ys, texts


def _shown(categorical: bool):
    """How a hyperparameter's value is plotted: text for categorical ones (plotly makes
    a category axis), a number otherwise."""
    if categorical:
        return lambda v: None if v is None else str(v)
    return lambda v: None if v is None else float(v)


# -- rungs -------------------------------------------------------------------------------


def rung_budgets(spec: StudySpec, trials: Sequence[FrozenTrial]) -> list[float]:
    """The budgets (optimizer updates) at which the study's scheduler decides, ascending.

    ASHA: Ray's milestones ``grace_period * reduction_factor**(k + s)`` of each bracket
    ``s``, and ``max_t`` (mo-asha: bracket 0's); Hyperband: each bracket's
    ``r0 = int(max_t * eta**-s)`` times ``eta**k`` up to ``max_t`` (Ray's
    ``HyperBandScheduler``); Optuna's successive-halving pruner (a given ``min_resource``)
    and Hyperband pruner their rungs' completion steps.
    ``max_t`` not given: the most updates a trial planned or reached. Other schedulers
    (the median rule, Optuna's median, percentile, Wilcoxon, patient pruners) have no
    rungs: their trials' evaluation steps. At most ``MAX_RUNGS`` budgets, evenly picked.
    """
    s = spec.scheduler
    reached = [step for t in trials if (step := last_step(t)) is not None]
    planned = [t.user_attrs["planned_updates"] for t in trials
               if t.user_attrs.get("planned_updates")]
    top = getattr(s, "max_t", None) or max(planned + reached, default=0)
    budgets = scheduler_rungs(spec, top)
    if not budgets:
        budgets = {step for t in trials for step in t.intermediate_values} | set(reached)
    return _thin(sorted(float(b) for b in budgets))


def scheduler_rungs(spec: StudySpec, top: float) -> set[float]:
    """The rungs of the study's scheduler up to ``top`` updates (see :func:`rung_budgets`);
    empty for a scheduler without rungs. At most ``MAX_BRACKETS`` brackets and
    ``MAX_BRACKETS`` rungs per bracket are listed (a reduction factor near 1 has more)."""
    s, budgets = spec.scheduler, set()
    if s.name in ("asha", "mo-asha") and top >= s.grace_period:  # mo-asha: one bracket
        for b in range(min(getattr(s, "brackets", 1), MAX_BRACKETS)):
            n = int(math.log(top / s.grace_period) / math.log(s.reduction_factor) - b + 1)
            budgets |= {s.grace_period * s.reduction_factor ** (k + b)
                        for k in range(min(n, MAX_BRACKETS))}
        budgets.add(top)
    elif s.name == "hyperband" and top >= 1:
        eta = s.reduction_factor
        for b in range(min(int(round(math.log(top) / math.log(eta))) + 1, MAX_BRACKETS)):
            r = int(top * eta ** -b)
            for _ in range(MAX_BRACKETS):
                if not 0 < r < top:
                    break
                budgets.add(r)
                r = int(min(r * eta, top))
        budgets.add(top)
    elif s.name == "optuna-pruner" and s.pruner.name == "successive-halving" \
            and s.pruner.min_resource != "auto":
        p = s.pruner
        budgets = _geometric(p.min_resource * p.reduction_factor ** p.min_early_stopping_rate,
                             p.reduction_factor, top)
    elif s.name == "optuna-pruner" and s.pruner.name == "hyperband":
        p = s.pruner
        high = top if p.max_resource == "auto" else p.max_resource
        budgets = _geometric(p.min_resource, p.reduction_factor, high)
    return budgets


def _geometric(low: float, factor: float, high: float) -> set[float]:
    """``low * factor**k`` up to ``high``, at most ``MAX_BRACKETS`` of them."""
    out, b = set(), low
    while b <= high and len(out) < MAX_BRACKETS:
        out.add(b)
        b *= factor
    return out


def _thin(budgets: list[float]) -> list[float]:
    """At most ``MAX_RUNGS`` of ascending ``budgets``, evenly picked, first and last kept."""
    if len(budgets) <= MAX_RUNGS:
        return budgets
    return [budgets[round(i * (len(budgets) - 1) / (MAX_RUNGS - 1))] for i in range(MAX_RUNGS)]


def reach(trial: FrozenTrial, top: float) -> float:
    """The updates a trial reached (:func:`last_step`); a COMPLETE one that reported no
    step (a multi-objective trial) reached ``top``."""
    step = last_step(trial)
    if step is None:
        return top if trial.state == TrialState.COMPLETE else 0
    return step


def rung_counts(trials: Sequence[FrozenTrial], budgets: Sequence[float]
                ) -> tuple[list[int], dict[str, list[int]]]:
    """Trials reaching each rung (``reach >= budget``), and the PRUNED trials stopped at
    each rung by whom (``stopped_by``): a trial stopped after ``budget_updates`` counts at
    the highest rung at or below that budget (the lowest rung if it stopped before any).

    Returns:
        ``(reached, stopped)``: ``reached[i]`` trials reached ``budgets[i]``;
        ``stopped[by][i]`` of them ``by`` stopped there.
    """
    top = budgets[-1] if budgets else 0
    ran = [t for t in trials if t.state != TrialState.WAITING]
    reached = [sum(1 for t in ran if reach(t, top) >= b) for b in budgets]
    stopped: dict[str, list[int]] = {}
    for t in ran:
        if t.state != TrialState.PRUNED or not budgets:
            continue
        by = str(t.user_attrs.get("stopped_by", "unknown"))
        at = reach(t, top)
        i = max([i for i, b in enumerate(budgets) if b <= at], default=0)
        stopped.setdefault(by, [0] * len(budgets))[i] += 1
    return reached, stopped


def rung_figure(spec: StudySpec, trials: Sequence[FrozenTrial]) -> go.Figure:
    """Trials reaching each rung, those stopped at each (by whom), and each pruned trial at
    the budget it was stopped (``budget_updates``), one marker trace per stopper."""
    budgets = rung_budgets(spec, trials)
    reached, stopped = rung_counts(trials, budgets)
    labels = [f"{b:g}" for b in budgets]
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.2, subplot_titles=[
        "trials reaching each rung (its budget in optimizer updates)",
        "pruned trials: who stopped each, at which budget"])
    fig.add_trace(go.Bar(x=labels, y=reached, name="reached", text=reached), row=1, col=1)
    for i, (by, counts) in enumerate(sorted(stopped.items())):
        color = COLORS[(i + 1) % len(COLORS)]
        fig.add_trace(go.Bar(x=labels, y=counts, name=f"stopped here by {by}",
                             legendgroup=by, marker={"color": color}), row=1, col=1)
        pruned = sorted((t for t in trials if t.state == TrialState.PRUNED
                         and str(t.user_attrs.get("stopped_by", "unknown")) == by),
                        key=lambda t: t.number)
        fig.add_trace(go.Scatter(
            x=[reach(t, 0) for t in pruned], y=[t.number for t in pruned], mode="markers",
            name=f"stopped by {by}", legendgroup=by, marker={"color": color},
            text=[f"trial {t.number} stopped by {by} at {reach(t, 0):g} updates"
                  for t in pruned], hoverinfo="text"), row=2, col=1)
    fig.update_xaxes(type="category", row=1, col=1)  # its title: the panel's
    fig.update_xaxes(title_text="stopped at (optimizer updates)", row=2, col=1)
    fig.update_yaxes(title_text="trials", row=1, col=1)
    fig.update_yaxes(title_text="trial number", row=2, col=1)
    fig.update_layout(title_text=f"Rungs of {spec.scheduler.name}", barmode="group",
                      template=TEMPLATE)
    return fig


# -- cost --------------------------------------------------------------------------------


def finish_order(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """Finished trials (COMPLETE, PRUNED, FAIL) in the order they ended (then by number)."""
    done = [t for t in trials if t.state in FINISHED]
    return sorted(done, key=lambda t: (t.datetime_complete or datetime.max, t.number))


def cost_figure(spec: StudySpec, trials: Sequence[FrozenTrial],
                device_kind: str = "cpu") -> go.Figure:
    """What quality cost: each finished trial's device-seconds (bars by state), and the
    best value so far of each objective (of feasible trials, with constraints) against
    the cumulative device-seconds of every finished trial (pruned and failed ones cost
    too), in the order trials ended.

    ``device_kind``: ``cpu`` or ``gpu``, what the trials' ``device_seconds`` count (the
    study's ``device_kind`` attribute).
    """
    unit = f"{device_kind.upper()}-seconds"
    done = finish_order(trials)
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.2, subplot_titles=[
        f"{unit} per trial (by trial number)",
        f"best value so far against the total {unit} spent"])
    for state in FINISHED:
        some = sorted((t for t in done if t.state == state), key=lambda t: t.number)
        if some:
            fig.add_trace(go.Bar(x=[t.number for t in some], y=[_cost(t) for t in some],
                                 name=state.name), row=1, col=1)
    spent, total = [], 0.0
    for t in done:
        total += _cost(t)
        spent.append(round(total, 3))
    for k, objective in enumerate(spec.objectives):
        pick = max if objective.direction == "maximize" else min
        xs, ys, texts, best = [], [], [], None
        for t, x in zip(done, spent, strict=True):
            if t.state == TrialState.COMPLETE and t.values is not None and \
                    all(c <= 0.0 for c in t.constraints.values()):  # feasible (constraints)
                best = t.values[k] if best is None else pick(best, t.values[k])
            if best is not None:
                xs.append(x)
                ys.append(best)
                texts.append(f"after trial {t.number}")
        fig.add_trace(go.Scatter(x=xs, y=ys, text=texts, mode="lines+markers",
                                 line_shape="hv", name=f"best {objective.metric} so far"),
                      row=2, col=1)
    fig.update_xaxes(title_text=f"cumulative {unit}", row=2, col=1)
    fig.update_yaxes(title_text=unit, row=1, col=1)
    fig.update_layout(title_text=f"Cost: {round(total, 3):g} {unit} in all", barmode="stack",
                      template=TEMPLATE)
    return fig


def _cost(trial: FrozenTrial) -> float:
    return float(trial.user_attrs.get("device_seconds", 0.0))
