"""Request-body schemas in the OpenAPI document for endpoints that read their body themselves.

The collector endpoints read bodies through :mod:`gateway.body` (size limit and
deadline) instead of letting FastAPI parse them, so FastAPI cannot see the
models; this adds them to the generated document.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

REF = "#/components/schemas/{model}"


def install(app: FastAPI, bodies: Mapping[str, type[BaseModel]]) -> None:
    """Make ``app.openapi()`` document ``bodies`` (path -> model) as JSON request bodies of their POSTs."""

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
        app.openapi_schema = doc
        return doc

    setattr(app, "openapi", openapi)  # noqa: B010 - FastAPI documents this override
