"""``hpo submit --wait``: a progress bar of a study's finished trials, fed by polling the API."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from service.client import Client, objective_metrics


def describe(study: dict) -> str:
    """``RUNNING  2 running  3 pruned  0 failed  best 0.9721`` (several objectives:
    ``front 3``, the Pareto front's size)."""
    c = study["counts"]
    if len(objective_metrics(study)) > 1:
        best_text = f"front {len(study['best_trials'])}"
    else:
        best = study["best_trials"][0]["values"][0] if study["best_trials"] else None
        best_text = f"best {best:.4f}" if isinstance(best, float) else "best -"
    return (f"{study['status']:<9} {c['running']} running  {c['pruned']} pruned  "
            f"{c['failed']} failed  {best_text}")


def follow(client: Client, name: str, console: Console, poll_s: float = 1.0) -> dict:
    """Show a progress bar of ``name``'s finished trials until the study ends; its last view.

    Raises:
        service.client.ApiError: the service answered an error.
    """
    if not console.is_terminal:
        return _follow_plain(client, name, console, poll_s)
    columns = (TextColumn("[bold]{task.fields[name]}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[detail]}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("trials", total=None, name=name, detail="")

        def update(study: dict) -> None:
            bar.update(task, total=study["n_trials"], completed=study["progress"]["finished"],
                       detail=describe(study))

        return client.wait(name, update, poll_s)


def _follow_plain(client: Client, name: str, console: Console, poll_s: float) -> dict:
    """One line per change, for logs and pipes (a progress bar needs a terminal)."""
    last = None

    def update(study: dict) -> None:
        nonlocal last
        line = f"{name}: {study['progress']['finished']}/{study['n_trials']} finished  " \
               f"{describe(study)}"
        if line != last:
            console.print(line, highlight=False, soft_wrap=True)
            last = line

    return client.wait(name, update, poll_s)
