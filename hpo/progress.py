"""A live terminal view of a running study (rich): trial counts by state and the best so far."""

from __future__ import annotations

import time

from rich.console import Console
from rich.live import Live
from rich.table import Table

from hpo.record import StudyRecord
from hpo.recordtypes import Counts


class LiveProgress:
    """Context manager; pass :meth:`update` as ``run_study``'s ``on_change``.

    Redraws at most ``max_hz`` times per second, so that frequent results cost
    the driver nothing noticeable.
    """

    def __init__(self, n_trials: int, console: Console | None = None, max_hz: float = 4.0) -> None:
        self.n_trials = n_trials
        self.console = console or Console(stderr=True, markup=False, emoji=False)
        self.min_interval = 1.0 / max_hz
        self.last_draw = 0.0
        self.counts, self.best = Counts(), None
        self.live = Live(self._table(), console=self.console, auto_refresh=False,
                         transient=False)

    def __enter__(self) -> LiveProgress:
        self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.live.update(self._table(), refresh=True)
        self.live.__exit__(*exc)

    def update(self, record: StudyRecord, force: bool = False) -> None:
        self.counts, self.best = record.counts(), record.best
        now = time.monotonic()
        if force or now - self.last_draw >= self.min_interval:
            self.last_draw = now
            self.live.update(self._table(), refresh=True)

    def finish(self, counts: Counts, best: tuple[int, float] | None) -> None:
        """The study as the run left it: a run with nothing left to do (the study was
        finished already) changes no trial, so :meth:`update` was never called and the
        table said 0 finished."""
        self.counts, self.best = counts, best
        self.live.update(self._table(), refresh=True)

    def _table(self) -> Table:
        table = Table(title="study progress", show_header=True, header_style="bold")
        for column in ["finished", "running", "complete", "pruned", "failed", "best so far"]:
            table.add_column(column, justify="right")
        c = self.counts
        best = "-" if self.best is None else f"{self.best[1]:.4f} (#{self.best[0]})"
        table.add_row(f"{c.finished}/{self.n_trials}", str(c.running), str(c.complete),
                      str(c.pruned), str(c.failed), best)
        return table
