"""The OpenAPI 3.1 document for Tether's REST API."""

from django.http import JsonResponse

_ERROR = {"description": "Error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _op(summary: str, ok: str, schema: str | None = None, body: str | None = None, params: list | None = None) -> dict:
    op: dict = {
        "summary": summary,
        "responses": {
            ok: {"description": "OK"}
            | ({"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}} if schema else {}),
            "400": _ERROR,
            "401": _ERROR,
            "404": _ERROR,
            "409": _ERROR,
        },
    }
    if body:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{body}"}}},
        }
    if params:
        op["parameters"] = params
    return op


def _path_params(*names: str) -> list[dict]:
    return [{"name": n, "in": "path", "required": True, "schema": {"type": "integer"}} for n in names]


RUN = _path_params("instance_id", "run_id")

SPEC = {
    "openapi": "3.1.0",
    "info": {"title": "Tether", "version": "1", "description": "Durable, governed autonomous agent loops."},
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "Error": {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]},
            "Check": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "command": {"type": "array", "items": {"type": "string"}},
                    "required": {"type": "boolean", "default": True},
                    "timeout": {"type": "number"},
                },
                "required": ["name", "command"],
                "additionalProperties": False,
            },
            "InstanceIn": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "maxLength": 100},
                    "brain": {"enum": ["command", "anthropic"]},
                    "command": {"type": "array", "items": {"type": "string"}},
                    "env": {"type": "object", "additionalProperties": {"type": "string"}},
                    "workspace": {"type": "string"},
                    "checks": {"type": "array", "items": {"$ref": "#/components/schemas/Check"}},
                    "decider": {"enum": ["checks", "llm"]},
                    "max_iterations": {"type": "integer", "minimum": 1, "maximum": 10000},
                    "objective_max_chars": {"type": "integer", "minimum": 1},
                    "act_timeout_seconds": {"type": "integer", "minimum": 1},
                },
            },
            "Instance": {"allOf": [{"$ref": "#/components/schemas/InstanceIn"}], "properties": {"id": {"type": "integer"}}},
            "RunIn": {
                "type": "object",
                "additionalProperties": False,
                "required": ["objective"],
                "properties": {
                    "objective": {"type": "string"},
                    "max_iterations": {"type": "integer"},
                    "max_cost_usd": {"type": ["number", "string"]},
                    "max_minutes": {"type": "integer"},
                },
            },
            "Run": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "instance": {"type": "integer"},
                    "status": {"enum": ["queued", "running", "waiting", "finished"]},
                    "outcome": {"type": ["string", "null"]},
                    "outcome_detail": {"type": ["string", "null"]},
                    "verified": {"type": ["boolean", "null"]},
                    "iterations": {"type": "integer"},
                    "spent_usd": {"type": "string"},
                    "last_seq": {"type": "integer"},
                },
            },
            "Interjection": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "message": {"type": "string"},
                    "approve": {"type": "boolean", "description": "answer a run parked on a tool call needing approval"},
                },
            },
            "Events": {
                "type": "object",
                "properties": {
                    "events": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "seq": {"type": "integer"},
                                "kind": {"type": "string"},
                                "at": {"type": "string"},
                                "data": {"type": "object"},
                            },
                        },
                    },
                    "last_seq": {"type": "integer"},
                    "more": {"type": "boolean"},
                },
            },
        },
    },
    "security": [{"bearer": []}],
    "paths": {
        "/v1/instances": {
            "get": _op("List your instances", "200"),
            "post": _op("Create an instance", "201", "Instance", "InstanceIn"),
        },
        "/v1/credentials": {
            "get": _op("List your stored Anthropic keys (last four characters only)", "200"),
            "post": _op("Store an Anthropic key (write-only)", "201"),
        },
        "/v1/instances/{instance_id}/loop": {
            "get": _op("List the instance's runs", "200", params=_path_params("instance_id")),
            "post": _op("Start a run", "201", "Run", "RunIn", _path_params("instance_id")),
        },
        "/v1/instances/{instance_id}/loop/{run_id}": {"get": _op("Get a run", "200", "Run", params=RUN)},
        "/v1/instances/{instance_id}/loop/{run_id}/cancel": {"post": _op("Stop a run", "202", "Run", params=RUN)},
        "/v1/instances/{instance_id}/loop/{run_id}/interject": {
            "post": _op("Queue a message for the next iteration (answers a waiting run)", "202", body="Interjection", params=RUN)
        },
        "/v1/instances/{instance_id}/loop/{run_id}/resume": {
            "post": {
                **_op("Resume a budget_exhausted run (optionally raising its cap first)", "202", "Run", params=RUN),
                "requestBody": {
                    "required": False,
                    "content": {"application/json": {"schema": {
                        "type": "object", "additionalProperties": False,
                        "properties": {"max_cost_usd": {"type": ["number", "string"]}},
                    }}},
                },
            }
        },
        "/v1/instances/{instance_id}/loop/{run_id}/close": {
            "post": _op("Close a waiting run as escalated", "202", "Run", params=RUN)
        },
        "/v1/instances/{instance_id}/loop/{run_id}/receipt": {
            "get": _op("The finished run's signed receipt (verify with `manage.py loop verify-receipt FILE`)", "200", params=RUN)
        },
        "/v1/instances/{instance_id}/loop-decide": {
            "post": _op("Run the instance's decider once on a snapshot (no side effects)", "200",
                        params=_path_params("instance_id"))
        },
        "/v1/pools": {"get": _op("Your budget pools: limit, spent, reserved, period", "200")},
        "/v1/instances/{instance_id}/loop/{run_id}/events": {
            "get": _op(
                "Events after a seq",
                "200",
                "Events",
                params=[*RUN, {"name": "after", "in": "query", "schema": {"type": "integer", "minimum": 0}}],
            )
        },
    },
}


def document(request):
    return JsonResponse(SPEC)
