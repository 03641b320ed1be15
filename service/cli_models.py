"""``hpo model NAME [--trial N] [-o FILE]``: download a trial's final model from the service.

The default trial is the study's best (``GET /v1/studies/NAME/model``); ``--trial N``
asks for trial N (``GET /v1/studies/NAME/trials/N/model``). The file is written
atomically to FILE (default: the name the service gives, ``NAME-trialN.pt``, in the
current directory). ``python -m trainers evaluate FILE`` re-evaluates it. Exit
status: 0 written; 1 the service answered an error (no such study, or no kept model)
or the file cannot be written; 2 an invalid option.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from service.cli import DEFAULT_URL, NameArg, TokenOpt, UrlOpt, _client, _fail, err, out

CHUNK_BYTES = 1 << 20


def register(app: typer.Typer) -> None:
    """Add ``hpo model`` to the ``hpo`` typer app."""
    app.command("model")(model)


def model(name: NameArg,
          trial: Annotated[int | None, typer.Option(
              "--trial", min=0, help="the trial's number (default: the best trial)",
              show_default=False)] = None,
          output: Annotated[Path | None, typer.Option(
              "--output", "-o", dir_okay=False, show_default=False,
              help="where to write the file (default: NAME-trialN.pt here)")] = None,
          url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Download a trial's final model (default: the best trial's)."""
    from service.client import ApiError, study_path

    path = study_path(name, "model") if trial is None else \
        study_path(name, "trials", str(trial), "model")
    client = _client(url, token)
    try:
        written, size = _download(client, path, output)
    except ApiError as e:
        _fail(e)
    except OSError as e:
        err.print(f"[bold red]error:[/] cannot write {escape(str(output or 'the model file'))}: "
                  f"{escape(str(e.strerror))}", highlight=False, markup=True)
        raise typer.Exit(1) from None
    finally:
        client.close()
    command = f"{shlex.quote(sys.executable)} -m trainers evaluate {shlex.quote(str(written))}"
    out.print(f"wrote {written} ({size:,} bytes); evaluate it with: {command}",
              highlight=False, soft_wrap=True)


def _download(client, path: str, output: Path | None) -> tuple[Path, int]:
    """Stream ``path`` into ``output`` (temporary file, then rename); the file and its size.

    Raises:
        ApiError: an error answer, or no answer.
        OSError: the file cannot be written.
    """
    import httpx

    from service.client import ApiError

    try:
        with client.http.stream("GET", path) as response:
            if response.status_code >= 400:
                response.read()
                _raise_error(response)
            target = output or Path(_filename(response.headers.get("content-disposition")))
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            size = 0
            try:
                with open(tmp, "wb") as f:
                    for chunk in response.iter_bytes(CHUNK_BYTES):
                        f.write(chunk)
                        size += len(chunk)
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
    except httpx.HTTPError as e:
        raise ApiError(0, "unreachable", f"cannot reach {client.http.base_url}: {e}") from None
    return target, size


def _filename(disposition: str | None) -> str:
    """The file name of a ``Content-Disposition`` answer, reduced to a plain name."""
    found = re.search(r'filename="([^"/\\]+)"', disposition or "")
    return found.group(1) if found else "model.pt"


def _raise_error(response) -> None:
    from service.client import ApiError

    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        error = {"code": "http_error", "message": response.text[:500]}
    raise ApiError(response.status_code, error.get("code", ""), error.get("message", ""),
                   error.get("details"))
