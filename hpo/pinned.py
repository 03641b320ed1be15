"""The pinned versions of the libraries whose private names the code uses.

``hpo.ray_private`` (Ray), ``hpo.storage`` (Optuna) and ``service.dashboard_cache``
(optuna-dashboard) are the only modules that use a library's private names; each
calls :func:`require` at import, so an
upgrade fails there, loudly and in one place, rather than somewhere in a running
study.
"""

from __future__ import annotations


def require(library: str, found: str, pinned: str, module: str) -> None:
    """Refuse to import ``module`` under another version of ``library`` than ``pinned``.

    Raises:
        ImportError: ``found`` is not ``pinned``, naming both and what to check.
    """
    if found != pinned:
        raise ImportError(
            f"{module} was written against {library} {pinned}, found {found}: check its "
            f"private names against the new {library}, then update the pinned version there")
