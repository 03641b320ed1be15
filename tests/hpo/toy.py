"""``toy-hpo``: a tiny real training run whose validation curve the test controls.

Training is the real ``trainers.fit`` loop on a 48-sample regression problem
(milliseconds per update). The reported ``val_loss`` is scripted, so that tests
know which trials a scheduler should stop: after ``k`` evaluations it is
``quality + 1 / (k + 1)`` (lower quality = better trial), and ``val_score`` is
``score - val_loss``. Options also make a trial raise, report NaN, or slow down.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

import torch

from tests.trainers.toy_tasks import RegressionOptions, RegressionTask
from trainers.fields import option


@dataclasses.dataclass(frozen=True, kw_only=True)
class HpoToyOptions(RegressionOptions):
    quality: float = option(1.0, "offset of the scripted val_loss (lower is better)")
    score: float = option(0.0, "added to val_score (-val_loss): a second objective that "
                               "conflicts with val_loss")
    fail_at_update: int = option(0, "raise RuntimeError in this update (0: never)")
    exit_at_update: int = option(0, "call sys.exit with a message in this update (0: never)")
    bare_exit_at_update: int = option(0, "call sys.exit() in this update (0: never)")
    nan_from_eval: int = option(0, "val_loss is NaN from this evaluation on (0: never)")
    sleep_ms: int = option(0, "sleep this long in every micro-batch")
    die_at_update: int = option(0, "kill the trial's process in this update (0: never)")
    die_signal: int = option(0, "0: os._exit(1); else the signal to send to itself (9 = SIGKILL)")
    once_marker: str = option("", "file: dying/raising happens only while it does not exist")


class HpoToyTask(RegressionTask):
    name = "toy-hpo"
    Options = HpoToyOptions
    mutable_options = frozenset({"quality"})  # scripted: it shapes no parameter
    metrics = {"val_loss": "minimize", "val_score": "maximize"}

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self.calls = 0
        self.evals = 0

    def datasets(self, seed: int):
        return super().datasets(seed)

    def _first_time(self) -> bool:
        """True unless the once-marker exists; creates it (so a retry goes on)."""
        marker = self.options.once_marker
        if not marker:
            return True
        if os.path.exists(marker):
            return False
        open(marker, "w").close()
        return True

    def loss_sum(self, model, batch) -> torch.Tensor:
        self.calls += 1
        o = self.options
        if o.fail_at_update and self.calls >= o.fail_at_update and self._first_time():
            raise RuntimeError(f"toy failure at update {self.calls}")
        if o.exit_at_update and self.calls == o.exit_at_update:
            sys.exit(f"toy exit at update {self.calls}")
        if o.bare_exit_at_update and self.calls == o.bare_exit_at_update:
            sys.exit()
        if o.die_at_update and self.calls == o.die_at_update and self._first_time():
            if o.die_signal:
                os.kill(os.getpid(), o.die_signal)
            os._exit(1)
        if self.options.sleep_ms:
            time.sleep(self.options.sleep_ms / 1000)
        return super().loss_sum(model, batch)

    def eval_metrics(self, sums):
        self.evals += 1
        o = self.options
        loss = o.quality + 1.0 / (self.evals + 1)
        if o.nan_from_eval and self.evals >= o.nan_from_eval:
            loss = float("nan")
        return {"val_loss": loss, "val_score": o.score - loss}
