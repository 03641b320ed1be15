"""What a study's driver shows on the dashboard's study page: its note and its charts.

:class:`StudyBoard` is called by ``hpo.tune.driver.run_study``: ``started`` when the
driver holds the study (the note, status RUNNING), ``poke`` after every trial event
(charts, at most every ``min_interval_s`` and never more often than ten times what the
last write cost, so that a large study's writes stay a small part of Tune's event
loop), and ``ended`` once (the charts' final state, the note with the outcome). Nothing
here raises into the study: a failed write is logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import optuna

from hpo.notes import NoteEnd, save_study_note
from hpo.spec import StudySpec

log = logging.getLogger(__name__)

MIN_CHART_INTERVAL_S = 5.0
COST_FACTOR = 10.0  # the next chart write waits at least this many times the last one's cost


def preload() -> None:
    """Import now what the first note and chart writes would import: optuna-dashboard
    (about 2 s on 2 cores: its package imports ``optuna.importance``, and with it
    scikit-learn) and plotly (``hpo.charts``). A warm driver calls it while it waits
    for its study, so that the study's first seconds are not spent importing."""
    import optuna_dashboard  # noqa: F401

    import hpo.charts  # noqa: F401


class StudyBoard:
    """The note and the charts of one study, kept current by its driver.

    Args:
        study: the study (``hpo.record.StudyRecord.study``).
        spec: its spec.
        owner: who owns it (the service's token name), for the note; ``None`` leaves
            the owner out (``hpo run``).
        min_interval_s: the least time between two chart writes during the run.
        clock: seconds, monotonic (tests pass their own).
    """

    def __init__(self, study: optuna.Study, spec: StudySpec, owner: str | None = None,
                 min_interval_s: float = MIN_CHART_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.study, self.spec, self.owner = study, spec, owner
        self.min_interval_s = min_interval_s
        self.clock = clock
        self.next_write = 0.0
        self.saved: dict[str, str] = {}  # graph object id -> the figure JSON last saved

    def started(self) -> None:
        """The driver holds the study: its note says RUNNING."""
        save_study_note(self.study, self.spec, self.owner)

    def poke(self) -> None:
        """A trial event: write the charts if the last write is long enough ago."""
        now = self.clock()
        if now < self.next_write:
            return
        self.write_charts()
        cost = self.clock() - now
        self.next_write = now + max(self.min_interval_s, COST_FACTOR * cost)

    def ended(self, end: NoteEnd) -> None:
        """The run ended (``end``): the charts' final state, and the note's outcome."""
        self.write_charts()
        save_study_note(self.study, self.spec, self.owner, end)

    def write_charts(self) -> None:
        """Save every chart of the study whose figure changed since it was last saved."""
        try:
            from optuna_dashboard import save_plotly_graph_object

            from hpo.charts import study_figures

            trials = self.study.get_trials(deepcopy=False)
            kind = self.study.user_attrs.get("device_kind", "cpu")
            for graph_id, figure in study_figures(self.spec, trials, kind).items():
                text = figure.to_json()
                if self.saved.get(graph_id) != text:
                    save_plotly_graph_object(self.study, figure, graph_object_id=graph_id)
                    self.saved[graph_id] = text
        except Exception:  # noqa: BLE001 - a chart never breaks a study
            log.exception("cannot write the dashboard charts of study %s", self.spec.name)


def note_failure(storage: optuna.storages.BaseStorage, spec: StudySpec, owner: str | None,
                 error: str) -> None:
    """The note of a stored study whose driver failed before it could hold it: FAILED,
    with ``error`` (one line). A study that is not stored is left alone."""
    try:
        study = optuna.load_study(study_name=spec.name, storage=storage)
    except KeyError:
        return
    save_study_note(study, spec, owner, NoteEnd("FAILED", error=error))
