"""``StudySearcher``: a Ray Tune searcher that asks the Optuna study for every trial.

Replaces ray's ``OptunaSearch``, which tells COMPLETE for trials a scheduler
stopped early and never records their last result (see DESIGN.md); here the
searcher only *asks*, and ``RecordCallback`` writes what really happened.
Run it with ``TuneConfig(max_concurrent_trials=N)``: without a concurrency
limiter Tune lets a custom searcher run one trial at a time (ray#46965).

Both search algorithms here ask the run's trial gate (``hpo.gate``) before a trial is made:
``StudySearcher`` for searcher studies, :class:`GatedVariants` (Ray's variant generator)
for PBT and PB2, which refuse any searcher. A refused trial is not made; Tune asks again
at its next step, and the study waits instead of failing.
"""

from __future__ import annotations

import json
from pathlib import Path

from ray.tune.search import BasicVariantGenerator, Searcher

from hpo.gate import GateKeeper, TrialResources
from hpo.record import Orphan, StudyRecord
from hpo.stopping import StudyStopRule
from hpo.tune.trainable import RESUME_KEY


class StudySearcher(Searcher):
    """Suggests configurations: first the orphans to resume, then ``n_trials`` new ones.

    Args:
        record: the study's record; new configurations are asked of its sampler.
        n_trials: new trials to ask for.
        resumes: trials a previous driver left running with a checkpoint: each is
            adopted by a new Ray trial, which resumes from that checkpoint and
            continues the same Optuna trial.
        keeper: the run's trial gate; ``suggest`` returns ``None`` (Tune asks again later)
            while it refuses. Default: no gate.
        stop_rule: the study's ``budget.stop_when`` (``hpo.stopping``): once it fires, no
            new trial is made (orphans are still resumed). Default: none.
    """

    def __init__(self, record: StudyRecord, n_trials: int,
                 resumes: list[Orphan] | None = None, keeper: GateKeeper | None = None,
                 stop_rule: StudyStopRule | None = None) -> None:
        super().__init__()
        self.record = record
        self.remaining = n_trials
        self.resumes = list(resumes or [])
        self.keeper = keeper or GateKeeper(None, TrialResources(0.0, 1.0))
        self.stop_rule = stop_rule

    def suggest(self, trial_id: str) -> dict | str | None:
        if not self.resumes and (self.remaining <= 0 or (
                self.stop_rule is not None and self.stop_rule.check() is not None)):
            return Searcher.FINISHED
        if not self.keeper.acquire(trial_id):
            return None
        if self.resumes:
            orphan = self.resumes.pop(0)
            self.record.adopt(trial_id, orphan)
            return {**orphan.params, RESUME_KEY: orphan.checkpoint}
        self.remaining -= 1
        try:
            return self.record.ask(trial_id)
        except BaseException:
            self.keeper.release(trial_id)
            raise

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        """Give back the trial's slot; its outcome is recorded by ``RecordCallback``."""
        self.keeper.release(trial_id)

    def save(self, checkpoint_path: str) -> None:
        """Tune snapshots searchers; ours keeps nothing that the storage does not."""
        Path(checkpoint_path).write_text(json.dumps({"remaining": self.remaining}))

    def restore(self, checkpoint_path: str) -> None:
        self.remaining = json.loads(Path(checkpoint_path).read_text())["remaining"]


class GatedVariants(BasicVariantGenerator):
    """Ray's variant generator (for PBT and PB2) that makes a trial only when the run's
    trial gate lets it start, and gives its slot back when Tune reports its end.

    Args:
        keeper: the run's trial gate.
        max_concurrent: trials alive at once (0: no limit); the gate is not asked while
            this many are alive.
        random_state: the seed of the variants.
    """

    def __init__(self, keeper: GateKeeper, max_concurrent: int = 0,
                 random_state: int | None = None) -> None:
        super().__init__(random_state=random_state, max_concurrent=max_concurrent)
        self.keeper = keeper
        self.n_alive = self.n_made = 0

    def next_trial(self):
        if self.n_made >= self.total_samples:  # all made: Ray's generator says it is finished
            return super().next_trial()
        if self.is_finished() or 0 < self.max_concurrent <= self.n_alive:
            return None
        key = self.keeper.new_key()
        if not self.keeper.acquire(key):
            return None
        trial = super().next_trial()
        if trial is None:  # the variants are all made
            self.keeper.release(key)
            return None
        self.keeper.bind(key, trial.trial_id)
        self.n_alive += 1
        self.n_made += 1
        return trial

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        super().on_trial_complete(trial_id, result=result, error=error)
        if trial_id in self.keeper.aliases:
            self.n_alive -= 1
        self.keeper.release(trial_id)
