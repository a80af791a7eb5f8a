"""api: the FastAPI app. Thin routes over the store and the control loop, pydantic schemas
that are not ORM classes, dependencies injected with ``Annotated``; OpenAPI at /openapi.json."""
