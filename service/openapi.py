"""The OpenAPI document: FastAPI's, with the study spec's schema as the body of
``POST /v1/studies``.

That route reads its body itself (JSON, or YAML with a YAML content type), so
FastAPI cannot see the body's model; the route names the component
``StudySpec`` and this module adds it, generated from :class:`hpo.spec.StudySpec`
with the models it refers to, to ``components.schemas``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from hpo.spec import StudySpec

SPEC_REF = "#/components/schemas/StudySpec"
# FastAPI documents its own 422 shape on every route with parameters; the service answers
# 422 in the one error shape (service.api_errors)
FASTAPI_422 = "#/components/schemas/HTTPValidationError"
ERROR_REF = "#/components/schemas/ErrorBody"


# a valid spec (examples/digits-tpe-asha.yaml, smaller): clients and API testers start here
SPEC_EXAMPLE = {
    "name": "digits-tpe", "task": "digits", "config": {"max_epochs": 2, "micro_batch_size": 64},
    "search_space": {"lr": {"type": "float", "low": 1e-4, "high": 0.3, "log": True},
                     "width": {"type": "int", "low": 8, "high": 64, "step": 8}},
    "objective": {"metric": "val_accuracy", "direction": "maximize"},
    "sampler": {"name": "tpe", "seed": 0}, "scheduler": {"name": "asha", "grace_period": 23},
    "budget": {"n_trials": 8, "max_concurrent_trials": 2},
}


def spec_body() -> dict[str, Any]:
    """The ``requestBody`` of ``POST /v1/studies``: a StudySpec as JSON or as YAML."""
    schema = {"$ref": SPEC_REF}
    return {"required": True, "description": "the study spec, as JSON or as YAML",
            "content": {media: {"schema": schema, "example": SPEC_EXAMPLE}
                        for media in ("application/json", "application/yaml")}}


def spec_schemas() -> dict[str, dict[str, Any]]:
    """``StudySpec``'s JSON schema and those of the models it refers to, by name, with
    references into ``#/components/schemas``."""
    schema = StudySpec.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas = schema.pop("$defs", {})
    schemas["StudySpec"] = schema
    return schemas


def install_openapi(app: FastAPI) -> None:
    """Make ``app.openapi()`` (``/openapi.json``) include the spec's schemas.

    Raises:
        RuntimeError: (when the document is built) a spec model's name is already the name
            of another schema of the API.
    """

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version,
                                   description=app.description, routes=app.routes)
            components = document.setdefault("components", {}).setdefault("schemas", {})
            _use_error_shape_for_422(document)
            components.pop("HTTPValidationError", None)
            components.pop("ValidationError", None)
            for name, schema in spec_schemas().items():
                if name in components and components[name] != schema:
                    raise RuntimeError(f"two OpenAPI schemas named {name!r}")
                components[name] = schema
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi


def _use_error_shape_for_422(document: dict[str, Any]) -> None:
    for operations in document["paths"].values():
        for operation in operations.values():
            answer = operation.get("responses", {}).get("422")
            content = (answer or {}).get("content", {}).get("application/json", {})
            if content.get("schema", {}).get("$ref") == FASTAPI_422:
                content["schema"] = {"$ref": ERROR_REF}
                answer["description"] = "invalid input; each detail names its field"
