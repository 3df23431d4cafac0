"""Request-body schemas in the OpenAPI document for endpoints that read their body themselves.

The collector endpoints read bodies through :mod:`gateway.body` (size limit and
deadline) instead of letting FastAPI parse them, so FastAPI cannot see the
models; this adds them to the generated document.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

REF = "#/components/schemas/{model}"


BEARER_SCHEME = "CollectorBearer"
BEARER = {
    "type": "http",
    "scheme": "bearer",
    "bearerFormat": "JWT",
    "description": (
        "An ES256 JWT signed by the collector's own enrolled key: sub and iss are the collector id, "
        "aud is versus-collector-gateway, and the lifetime is at most 300 s (docs/gateway.md)."
    ),
}


def install(
    app: FastAPI,
    bodies: Mapping[str, type[BaseModel]],
    bearer_paths: Iterable[str] = (),
    errors: Mapping[str, Mapping[int, str]] | None = None,
) -> None:
    """Make ``app.openapi()`` document ``bodies`` (path -> model) as JSON request bodies of their POSTs,
    the collector bearer token on every operation of ``bearer_paths``, and ``errors`` (path ->
    status -> the codes it carries) as responses with the error body."""
    bearer_paths = tuple(bearer_paths)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for path, model in bodies.items():
            schema = model.model_json_schema(ref_template=REF)
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
            doc["paths"][path]["post"]["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}},
            }
        if bearer_paths:
            doc["components"].setdefault("securitySchemes", {})[BEARER_SCHEME] = BEARER
            for path in bearer_paths:
                for operation in doc["paths"][path].values():
                    operation["security"] = [{BEARER_SCHEME: []}]
        for path, statuses in (errors or {}).items():
            for operation in doc["paths"][path].values():
                for status, codes in sorted(statuses.items()):
                    operation.setdefault("responses", {})[str(status)] = {
                        "description": f"Refused: {codes}",
                        "content": {"application/json": {"schema": {"$ref": REF.format(model="ErrorBody")}}},
                    }
        app.openapi_schema = doc
        return doc

    setattr(app, "openapi", openapi)  # noqa: B010 - FastAPI documents this override
