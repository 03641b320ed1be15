"""A small HTTP client of the REST API (httpx), used by ``hpo submit/status/trials/stop/best``."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from hpo.speclimits import NAME_PATTERN, NAME_RULE

ENDED = ("COMPLETED", "STOPPED", "FAILED")
DEFAULT_URL = "http://127.0.0.1:8000"
START_WAIT_S = 30.0  # a starting `hpo serve` is waited for this long (seconds)
RETRY_S = 0.5


class ApiError(Exception):
    """The service answered an error (or could not be reached: ``status`` 0).

    Attributes:
        status: the HTTP status (0: no answer).
        code: the error code of the answer (``invalid_spec``, ``conflict``, ...).
        details: ``[{"loc": ..., "msg": ...}]`` for an invalid spec.
    """

    def __init__(self, status: int, code: str, message: str,
                 details: list[dict] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.details = details or []


def study_path(name: str, *rest: str) -> str:
    """``/v1/studies/NAME[/REST...]`` for the study ``name``, percent-encoded.

    Raises:
        ValueError: ``name`` is no study name (:data:`hpo.speclimits.NAME_PATTERN`): a name
            with ``/``, ``..``, ``?`` or ``#`` would reach another route or another study.
    """
    if not re.fullmatch(NAME_PATTERN, name):
        raise ValueError(f"{shown(name)!r} is no study name: a study name {NAME_RULE}")
    return "/".join(("/v1/studies", quote(name, safe=""), *rest))


def _unresolvable(error: BaseException) -> bool:
    """Whether a connect error was a name that does not resolve (and will not by waiting:
    not ``EAI_AGAIN``, a resolver that failed for now). Every other connect error is waited
    out as a service that is starting: a refused connection, or one of several addresses
    of a name refused while another failed (``create_connection`` raises the last)."""
    final = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, socket.gaierror):
            return seen.errno in final
        seen = seen.__cause__ or seen.__context__
    return False


def shown(url: object) -> str:
    """``url`` for a message: a password in it replaced by ``***``."""
    return re.sub(r"(^|//)([^/@:\s]*):[^/@\s]*@", r"\1\2:***@", str(url))


class Client:
    """Calls the service at ``url`` with ``token`` (``None``: no Authorization header).

    Args:
        url: the service's base URL, e.g. ``http://127.0.0.1:8000``.
        token: a token from ``hpo token create``.
        timeout_s: per request, in seconds (> 0).
        start_wait_s: how long a failed connection is tried again, in seconds (>= 0):
            a service that is starting (``hpo serve`` starts Ray first) is waited for;
            a host name that does not resolve fails at once. A connection that failed
            never carried the request, so a retried POST is sent once.
        on_wait: called once with a message when the client starts waiting.
    """

    def __init__(self, url: str = DEFAULT_URL, token: str | None = None,
                 timeout_s: float = 30.0, start_wait_s: float = START_WAIT_S,
                 on_wait: Callable[[str], None] | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s)
        self.start_wait_s = start_wait_s
        self.on_wait = on_wait

    def call(self, method: str, path: str, **kwargs) -> Any:
        """One request; the decoded JSON answer (``None`` for 204).

        Raises:
            ApiError: an error answer, or no answer at all.
        """
        deadline = time.monotonic() + self.start_wait_s
        while True:
            try:
                response = self.http.request(method, path, **kwargs)
                break
            except httpx.ConnectError as e:
                if _unresolvable(e):  # no such host: waiting will not help
                    raise ApiError(0, "unreachable", f"cannot reach {shown(self.http.base_url)}:"
                                   f" {e} (set --url or HPO_URL)") from None
                if time.monotonic() >= deadline:
                    raise ApiError(0, "unreachable", f"cannot reach {shown(self.http.base_url)}:"
                                   f" {e}"
                                   f" (waited {self.start_wait_s:.0f} s; is `hpo serve` "
                                   f"running there? set --url or HPO_URL)") from None
                if self.on_wait is not None:
                    self.on_wait(f"waiting up to {self.start_wait_s:.0f} s for the service at "
                                 f"{shown(self.http.base_url)} to start ...")
                    self.on_wait = None
                time.sleep(RETRY_S)
            except httpx.HTTPError as e:
                raise ApiError(0, "unreachable", f"cannot reach {shown(self.http.base_url)}: "
                               f"{e}") from None
        if response.status_code >= 400:
            try:
                error = response.json()["error"]
            except (ValueError, KeyError, TypeError):
                error = {"code": "http_error", "message": response.text[:500]}
            raise ApiError(response.status_code, error.get("code", ""), error.get("message", ""),
                           error.get("details"))
        return response.json() if response.content else None

    def submit(self, spec_path: Path) -> dict:
        """POST a spec file (JSON by its ``.json`` suffix, else YAML); the created study."""
        media = "application/json" if spec_path.suffix == ".json" else "application/yaml"
        return self.call("POST", "/v1/studies", content=spec_path.read_bytes(),
                         headers={"Content-Type": media})

    def studies(self, status: str | None = None, offset: int = 0, limit: int = 50) -> dict:
        """A page of the studies this token sees, newest first."""
        params = {"offset": offset, "limit": limit, **({"status": status} if status else {})}
        return self.call("GET", "/v1/studies", params=params)

    def study(self, name: str) -> dict:
        return self.call("GET", study_path(name))

    def trials(self, name: str, offset: int = 0, limit: int = 50) -> dict:
        return self.call("GET", study_path(name, "trials"),
                         params={"offset": offset, "limit": limit})

    def stop(self, name: str) -> dict:
        return self.call("POST", study_path(name, "stop"))

    def wait(self, name: str, on_update: Callable[[dict], None] | None = None,
             poll_s: float = 1.0) -> dict:
        """Poll the study every ``poll_s`` seconds until it ends; the last view of it."""
        while True:
            study = self.study(name)
            if on_update is not None:
                on_update(study)
            if study["status"] in ENDED:
                return study
            time.sleep(poll_s)

    def close(self) -> None:
        self.http.close()


def objective_metrics(study: dict) -> list[str]:
    """The metrics of a study's objectives, in order, from its REST answer's ``spec`` (one
    objective is a mapping there, several a list)."""
    objective = study["spec"]["objective"]
    return [o["metric"] for o in (objective if isinstance(objective, list) else [objective])]
