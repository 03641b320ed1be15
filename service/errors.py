"""Errors of the service, all in one place; :mod:`service.api_errors` maps them to HTTP.

Errors of :mod:`hpo` (``SpecError``, ``StorageError``, ...) pass through the
service unchanged and are mapped there too.
"""

from __future__ import annotations


class ServiceError(Exception):
    """Base class of every error raised by :mod:`service`."""


class SettingsError(ServiceError, ValueError):
    """An environment variable has a bad value; the message names it."""


class NotAuthenticated(ServiceError):
    """No token, or a token that is not known (HTTP 401)."""


class Forbidden(ServiceError):
    """The token is known but may not do this (HTTP 403), e.g. dashboard writes by a non-admin."""


class StudyNotFound(ServiceError, LookupError):
    """No study of that name that this token may see (HTTP 404)."""


class TrialNotFound(ServiceError, LookupError):
    """No trial of that number in the study (HTTP 404)."""


class StudyConflict(ServiceError):
    """The request conflicts with the study's state: name taken, study running (HTTP 409)."""


class MalformedBody(ServiceError):
    """The request body is not well-formed JSON or YAML (HTTP 400)."""


class UnsupportedMediaType(ServiceError):
    """The request body has a content type the route does not read (HTTP 415)."""


class TokenExists(ServiceError):
    """A token of that name exists already (HTTP 409)."""


class TokenNotFound(ServiceError, LookupError):
    """No token of that name (HTTP 404)."""
