"""The ``hpo`` command line.

    hpo run SPEC [--storage URL] [--ray-address ADDR] [--results-dir DIR] [--num-cpus N]
    hpo worker --address HEAD:PORT [--num-gpus N] [--num-cpus N] [--resources JSON]
    hpo task new NAME DIR | hpo task check TARGET   (see ``hpo.task_cli``)

Installed packages add commands through the entry-point group ``hpo.cli``;
the service adds ``serve``, ``token create``, ``submit``, ``status``,
``trials``, ``stop`` and ``best`` (see ``service/cli.py``).

Exit status: 0 done; 2 invalid spec or option (each problem on its own line,
naming the field); 1 the study could not run (storage, cluster); 130 interrupted
(Ctrl-C, SIGTERM): running the same command again continues the study.
"""

from __future__ import annotations

import errno
import importlib.metadata
import logging
import os
import shlex
import signal
import subprocess
import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from hpo.errors import HpoError, SpecError, printable
from hpo.storage import DEFAULT_STORAGE_URL
from hpo.task_cli import task_app

app = typer.Typer(help="Hyperparameter optimization of PyTorch training: Optuna studies on "
                       "Ray Tune.", no_args_is_help=True, add_completion=False)
# soft_wrap: one line per error or problem, however long, and whole lines in a file or pipe;
# no markup or emoji codes read in what is printed: trials' parameters, reasons and errors
# are the users' text ("[/]" crashed rich, ":smile:" became an emoji); our own markup is
# asked for where it is written (markup=True, the user's part escaped)
err = Console(stderr=True, soft_wrap=True, markup=False, emoji=False)
out = Console(soft_wrap=True, markup=False, emoji=False)
MAX_LOCAL_CPUS = 100_000  # --num-cpus; Ray refuses more than 1e14 only after it started

StorageOpt = Annotated[str, typer.Option(
    "--storage", envvar="HPO_DATABASE_URL",
    help="Optuna storage URL: sqlite:///file.db or postgresql+psycopg://user@host/db")]
RayAddressOpt = Annotated[str | None, typer.Option(
    "--ray-address", envvar="RAY_ADDRESS", help="Ray cluster to join (default: a local Ray)")]


@app.callback()
def _group() -> None:
    """hpo: run and serve hyperparameter studies of PyTorch training."""


def _fail_spec(e: SpecError) -> None:
    err.print(f"\n[bold red]invalid spec[/] ({len(e.errors)} problem(s)):", markup=True)
    for problem in e.errors:
        err.print(f"  {problem['loc'] or '<spec>'}: {problem['msg']}", markup=False)
    raise typer.Exit(2)


def _usable_dir(path: Path, flag: str) -> None:
    """Create ``path`` (a directory the run writes into) now, or exit 2 naming ``flag``:
    before, an unusable one failed with a traceback after Ray had started."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "not writable")
    except OSError as e:
        err.print(f"[bold red]error:[/] {flag} {escape(repr(printable(str(path))))} cannot be "
                  f"used as a directory: {escape(str(e.strerror or e))}", highlight=False,
                  markup=True)
        raise typer.Exit(2) from None


@app.command()
def run(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="study spec, YAML or JSON")],
    storage: StorageOpt = DEFAULT_STORAGE_URL,
    ray_address: RayAddressOpt = None,
    results_dir: Annotated[Path, typer.Option(
        help="where Ray keeps trial results and checkpoints (shared storage on a cluster)")
    ] = Path("hpo-runs"),
    num_cpus: Annotated[int | None, typer.Option(
        min=1, max=MAX_LOCAL_CPUS, help="CPUs of a local Ray (default: all)")] = None,
    artifact_dir: Annotated[Path | None, typer.Option(
        help="where the best trials' final models are kept as Optuna artifacts "
             "(default: RESULTS_DIR/artifacts)", show_default=False)] = None,
) -> None:
    """Run a study to its budget with a live progress view, then print the best trial."""
    from hpo.spec import load_spec

    logging.getLogger("optuna").setLevel(logging.WARNING)
    try:
        spec = load_spec(spec_path)
    except SpecError as e:
        _fail_spec(e)
    _usable_dir(results_dir, "--results-dir")
    _usable_dir(artifact_dir or results_dir / "artifacts", "--artifact-dir")
    try:  # before Ray's seconds of starting and the progress table
        from hpo.storage import open_storage

        open_storage(storage).engine.dispose()
    except HpoError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, markup=True)
        raise typer.Exit(1) from None
    from hpo.progress import LiveProgress
    from hpo.taskcode import task_code
    from hpo.tune.driver import init_ray, run_study

    interrupted = threading.Event()
    try:
        # first, as run_study will join (with the task's code to ship, so that it does not
        # join again): Ray takes SIGTERM's handler each time it starts
        init_ray(ray_address, num_cpus, task_code(spec.task).runtime_env())
        handlers = {sig: signal.signal(sig, lambda *_: interrupted.set())
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            with LiveProgress(spec.budget.n_trials, err) as progress:
                result = run_study(spec, storage, ray_address=ray_address,
                                   results_dir=results_dir, num_cpus=num_cpus,
                                   artifact_dir=artifact_dir, on_change=progress.update,
                                   should_interrupt=interrupted.is_set)
                progress.finish(result.counts, None if result.best_number is None else
                                (result.best_number, result.best_value))
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    except SpecError as e:
        _fail_spec(e)
    except HpoError as e:
        err.print(f"\n[bold red]error:[/] {escape(str(e))}", markup=True)
        raise typer.Exit(1) from None
    c = result.counts
    if result.interrupted:
        err.print(f"\ninterrupted: {c.running} trial(s) left running; run the same command "
                  "again to continue the study (each resumes from its last checkpoint, or "
                  "runs again from the start if it had none yet)")
        raise typer.Exit(130)
    requeued = f", {c.requeued} requeued" if c.requeued else ""
    out.print(f"study {result.name}: {c.finished} trials finished "
              f"({c.complete} complete, {c.pruned} pruned, {c.failed} failed{requeued})")
    if result.stop_reason:
        out.print(f"stopped before its budget: {result.stop_reason}", markup=False)
    if result.pareto_front:
        metrics = [o.metric for o in spec.objectives]
        out.print(f"Pareto front: {len(result.pareto_front)} trial(s)")
        for number, values, params in result.pareto_front:
            shown = ", ".join(f"{m} = {v:.6g}" for m, v in zip(metrics, values, strict=True))
            out.print(f"  #{number}: {shown}  {params}")
        return
    if result.best_number is None:
        out.print("no complete and feasible trial (every complete trial breaks a constraint)"
                  if c.complete and spec.constraints else "no complete trial")
        if result.all_failed_reason is not None:  # helper-41: exit 0 hid a broken task
            err.print(f"\n[bold red]error:[/] every trial failed; the first: "
                      f"{escape(printable(result.all_failed_reason))}", markup=True)
            raise typer.Exit(3)
        return
    out.print(f"best trial #{result.best_number}: {spec.objectives[0].metric} = "
              f"{result.best_value:.6g}")
    for name, value in (result.best_params or {}).items():
        out.print(f"  {name} = {value!r}")


def _add_installed_commands() -> None:
    """Add the commands of installed packages: each entry point of the group ``hpo.cli``
    names a function that takes this app (the service's ``serve``, ``token``, ``submit``,
    ``status``, ``trials``, ``stop``, ``best``). ``hpo`` thus never imports ``service``."""
    for entry_point in importlib.metadata.entry_points(group="hpo.cli"):
        entry_point.load()(app)


_add_installed_commands()
app.add_typer(task_app, name="task")


@app.command()
def worker(
    address: Annotated[str, typer.Option(
        "--address", help="the Ray head's GCS address, HEAD:PORT (port 6379 by default)")],
    num_gpus: Annotated[int | None, typer.Option(min=0, help="GPUs this node offers")] = None,
    num_cpus: Annotated[int | None, typer.Option(min=1, max=MAX_LOCAL_CPUS,
                                                  help="CPUs this node offers")] = None,
    resources: Annotated[str | None, typer.Option(
        help='custom resources as JSON, e.g. \'{"a100": 1}\'')] = None,
    block: Annotated[bool, typer.Option(help="stay in the foreground until stopped")] = False,
    dry_run: Annotated[bool, typer.Option(help="print the ray start command only")] = False,
) -> None:
    """Start a Ray worker node that joins the cluster (a thin wrapper over `ray start`).

    The head needs the same token as every node when it uses token auth (the
    default of `ray start --head` once a token exists): export RAY_AUTH_MODE=token
    and RAY_AUTH_TOKEN before running this command.
    """
    from hpo.workers import WorkerOptionError, ray_start_command

    try:
        command = ray_start_command(address, num_gpus=num_gpus, num_cpus=num_cpus,
                                    resources=resources, block=block)
    except WorkerOptionError as e:
        err.print(f"[bold red]error:[/] {e.flag}: {escape(str(e))}", highlight=False, markup=True)
        raise typer.Exit(2) from None
    if not os.environ.get("RAY_AUTH_TOKEN") and not Path.home().joinpath(
            ".ray", "auth_token").exists():
        err.print("note: no RAY_AUTH_TOKEN in the environment: a head with token auth will "
                  "refuse this node (export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=...)")
    print(shlex.join(command), flush=True)  # quoted: it can be pasted into a shell
    if dry_run:
        return
    code = subprocess.call(command)
    if code == 0 and not block:
        out.print("worker node started. Stop it with `ray stop` (this stops every Ray "
                  "process on this machine).")
    raise typer.Exit(code)


def main() -> None:
    app()
