"""``StudySearcher``: a Ray Tune searcher that asks the Optuna study for every trial.

Replaces ray's ``OptunaSearch``, which tells COMPLETE for trials a scheduler
stopped early and never records their last result (see DESIGN.md); here the
searcher only *asks*, and ``RecordCallback`` writes what really happened.
Run it with ``TuneConfig(max_concurrent_trials=N)``: without a concurrency
limiter Tune lets a custom searcher run one trial at a time (ray#46965).
"""

from __future__ import annotations

import json
from pathlib import Path

from ray.tune.search import Searcher

from hpo.record import RESUME_KEY, Orphan, StudyRecord


class StudySearcher(Searcher):
    """Suggests configurations: first the orphans to resume, then ``n_trials`` new ones.

    Args:
        record: the study's record; new configurations are asked of its sampler.
        n_trials: new trials to ask for.
        resumes: trials a previous driver left running with a checkpoint: each is
            adopted by a new Ray trial, which resumes from that checkpoint and
            continues the same Optuna trial.
    """

    def __init__(self, record: StudyRecord, n_trials: int,
                 resumes: list[Orphan] | None = None) -> None:
        super().__init__()
        self.record = record
        self.remaining = n_trials
        self.resumes = list(resumes or [])

    def suggest(self, trial_id: str) -> dict | str | None:
        if self.resumes:
            orphan = self.resumes.pop(0)
            self.record.adopt(trial_id, orphan)
            return {**orphan.params, RESUME_KEY: orphan.checkpoint}
        if self.remaining <= 0:
            return Searcher.FINISHED
        self.remaining -= 1
        return self.record.ask(trial_id)

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        """Nothing to do: the trial's outcome is recorded by ``RecordCallback``."""

    def save(self, checkpoint_path: str) -> None:
        """Tune snapshots searchers; ours keeps nothing that the storage does not."""
        Path(checkpoint_path).write_text(json.dumps({"remaining": self.remaining}))

    def restore(self, checkpoint_path: str) -> None:
        self.remaining = json.loads(Path(checkpoint_path).read_text())["remaining"]
