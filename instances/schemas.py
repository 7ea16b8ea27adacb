"""The schema of an agent's configuration, and of the instances and credentials the API shows.

`InstanceIn` is the one statement of an instance's fields, their types and bounds: the API
parses request bodies with it (`InstanceChange`, the same fields none required, for a PATCH)
and documents it in /v1/openapi.json, and
`instances.validation.validate` (every surface that writes an instance: API, console)
checks values with it. What a user may set at all is `instances.capabilities`; whether the
model has a price is `instances.prices`. Touches no database.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo, model_validator

from instances.models import Instance as InstanceModel
from instances.tools import TOOLS, check_names, mcp
from instances.tools.mcp import SERVER_NAME
from tether import limits
from tether.schema import (
    INVISIBLE_CLASS,
    MAX_ID,
    NO_NUL,
    SPACE,
    Body,
    clean_text,
    flag,
    kind_of,
    listed,
    refuse,
    text,
    whole,
)

# Bounds of the numeric fields: (lowest, highest).
BOUNDS: dict[str, tuple[int, int]] = {
    "max_iterations": (1, limits.MAX_ITERATIONS),
    "objective_max_chars": (1, limits.OBJECTIVE_MAX_CHARS),
    "max_tool_turns": (1, limits.MAX_TOOL_TURNS),
    "max_output_tokens": (1, limits.MAX_OUTPUT_TOKENS),
    "tool_timeout_seconds": (1, limits.MAX_TOOL_TIMEOUT_SECONDS),
    "act_timeout_seconds": (1, limits.MAX_ACT_TIMEOUT_SECONDS),
}
ARGV = 'a non-empty list of strings (an argv), like ["ruff", "check", "."]'
_ARGV_SCHEMA = {
    "type": "array",
    "minItems": 1,
    "items": {"type": "string", "minLength": 1, "pattern": NO_NUL},
}


def _visible(value: str) -> str:
    from instances.validation import invisible  # lazy: instances.validation imports this module

    why = invisible(value)
    if why:
        raise refuse(why)
    return value


# A name people read to tell things apart: visible characters only (no bidirectional overrides,
# zero-width or control characters), 1 to 100 of them.
# The schema states the rule (`validation.INVISIBLE_CLASS`, spaces apart): its pattern is what `invisible` allows.
Name: Any = Annotated[
    text(nonblank=True, max_length=limits.NAME_MAX_CHARS),
    AfterValidator(_visible),
    Field(json_schema_extra={
        "pattern": f"^[^{INVISIBLE_CLASS}]*[^{SPACE}{INVISIBLE_CLASS}][^{INVISIBLE_CLASS}]*$",
        "minLength": 1, "maxLength": limits.NAME_MAX_CHARS,
    }),
]


def _nonempty(value: Any) -> str:
    text_ = clean_text(value)
    if not text_:
        raise refuse("must not be empty")
    return text_


def _argv(value: Any, *, empty: bool = False) -> list[str]:
    if not isinstance(value, list):
        raise refuse(
            f'must be a list of strings (an argv), like ["ruff", "check", "."], not {kind_of(value)}'
        )
    if (not value and not empty) or not all(isinstance(a, str) and a for a in value):
        raise refuse(f"must be {ARGV}")
    return [clean_text(a) for a in value]


def _command(value: Any) -> list[str]:
    return _argv(value, empty=True)  # a template's anthropic brain has none; the model checks the rest


def _choice(values: list[str]) -> Any:
    def check(value: Any) -> str:
        if value not in values:
            raise refuse(f"must be one of {', '.join(values)}; got {value!r}")
        return str(value)

    enum: list[Any] = list(values)
    return Annotated[str, BeforeValidator(check), Field(json_schema_extra={"enum": enum})]


def _tool_names(value: Any) -> list[str]:
    names = listed(_nonempty)(value)
    for i, name in enumerate(names):
        if mcp.is_mcp_name(name) and not re.fullmatch(mcp.PATTERN.pattern, name):
            raise refuse(f"[{i}] {name!r} is not an MCP tool name; write mcp__<server>__<tool>")
    try:
        return check_names(names)
    except ValueError as exc:
        raise refuse(f": {exc}") from None


def _server_names(value: Any) -> list[str]:
    names = listed(_nonempty)(value)
    for i, name in enumerate(names):
        if not re.fullmatch(SERVER_NAME.pattern, name):
            raise refuse(f"[{i}] {name!r} is not an MCP server's name (lowercase letters, digits, - and _)")
    if len(set(names)) != len(names):
        raise refuse(" names a server twice")
    return names


def _server_list_schema() -> dict[str, Any]:
    return {"uniqueItems": True, "items": {"type": "string", "pattern": SERVER_NAME.pattern}}


def _env(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in value.items()
    ):
        raise refuse("must map variable names to string values")
    return {clean_text(k): clean_text(v) for k, v in value.items()}


_ENV_SCHEMA = {
    "propertyNames": {"minLength": 1, "pattern": NO_NUL},
    "additionalProperties": {"type": "string", "pattern": NO_NUL},
}


def _base_url(value: Any) -> str:
    url = clean_text(value, max_length=limits.PATH_MAX_CHARS)
    if url and not url.startswith(("http://", "https://")):
        raise refuse("must start with http:// or https://")
    return url


def _response_schema(value: Any) -> dict[str, Any]:
    from instances.validation import json_schema_problem  # lazy: instances.validation imports this module

    if not isinstance(value, dict):
        raise refuse(f"must be a JSON Schema (an object; {{}} for none), not {kind_of(value)}")
    if why := json_schema_problem(value):
        raise refuse(why)
    if len(json.dumps(value)) > limits.PROMPT_MAX_CHARS:
        raise refuse(f"must be at most {limits.PROMPT_MAX_CHARS:,} characters as JSON")
    return value


ResponseSchema = Annotated[
    dict[str, Any],
    BeforeValidator(_response_schema),
    Field(description="a JSON Schema the final answer (parsed as JSON) must satisfy; {} for none"),
]


def _bounded(field: str) -> Any:
    low, high = BOUNDS[field]
    return whole(low, high, between=True)


def _tool_list_schema() -> dict[str, Any]:
    return {
        "type": "array",
        "items": {
            "anyOf": [
                {"enum": sorted(TOOLS)},
                {
                    "type": "string",
                    "pattern": mcp.PATTERN.pattern,
                    "description": "an MCP server's tools, mcp__<server>__<tool>",
                },
            ]
        },
    }


Strings = Annotated[
    list[str],
    BeforeValidator(listed(_nonempty)),
    Field(json_schema_extra={"items": {"type": "string", "minLength": 1, "pattern": NO_NUL}}),
]
McpServers = Annotated[
    list[str],
    BeforeValidator(_server_names),
    Field(json_schema_extra=_server_list_schema(), description="MCP servers an operator granted you"),
]
ToolNames = Annotated[list[str], BeforeValidator(_tool_names), Field(json_schema_extra=_tool_list_schema())]
Argv = Annotated[list[str], BeforeValidator(_argv), Field(json_schema_extra=_ARGV_SCHEMA)]
Command = Annotated[
    list[str], BeforeValidator(_command), Field(json_schema_extra={**_ARGV_SCHEMA, "minItems": 0})
]


def _timeout(value: Any) -> int | float:
    high = limits.MAX_TOOL_TIMEOUT_SECONDS
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= high:
        raise refuse(f"must be 1 to {high} seconds")
    return value


class CheckIn(Body):
    """A check run after every act: its argv, whether it must pass for done, its timeout, its evidence."""

    name: text(nonblank=True, max_length=limits.NAME_MAX_CHARS)  # type: ignore[valid-type]
    command: Argv
    required: flag() = True  # type: ignore[valid-type]
    timeout: Annotated[
        int | float,
        BeforeValidator(_timeout),
        Field(json_schema_extra={"exclusiveMinimum": 0, "maximum": limits.MAX_TOOL_TIMEOUT_SECONDS}),
    ] = 300
    evidence: Literal["report", "exit code"] | None = Field(
        None, description='"report": the check passes only with a test report (pytest); default: a report when there is one'
    )


def _unique_names(checks: list[CheckIn]) -> list[CheckIn]:
    seen: set[str] = set()
    for i, check in enumerate(checks):
        if check.name in seen:
            raise refuse(f"[{i}].name {check.name!r} is used twice")
        seen.add(check.name)
    return checks


class InstanceChange(Body):
    """The fields of an instance a PATCH may change: any of its settings, none required (not its template).

    Absent or null: unchanged. What the changed values make is checked as a whole (a command
    brain needs its command) by `instances.services.instance_update`.
    """

    name: Name | None = None
    brain: _choice(list(InstanceModel.Brain.values)) | None = None  # type: ignore[valid-type]
    command: Command | None = Field(None, description="the argv of the command brain")
    env: Annotated[dict[str, str], BeforeValidator(_env), Field(json_schema_extra=_ENV_SCHEMA)] | None = None
    workspace: text(max_length=limits.PATH_MAX_CHARS) | None = None  # type: ignore[valid-type]
    checks: Annotated[list[CheckIn], AfterValidator(_unique_names)] | None = None
    decider: _choice(list(InstanceModel.Decider.values)) | None = None  # type: ignore[valid-type]
    max_iterations: _bounded("max_iterations") | None = None  # type: ignore[valid-type]
    objective_max_chars: _bounded("objective_max_chars") | None = None  # type: ignore[valid-type]
    act_timeout_seconds: _bounded("act_timeout_seconds") | None = None  # type: ignore[valid-type]
    model: text(max_length=limits.NAME_MAX_CHARS) | None = None  # type: ignore[valid-type]
    system_prompt: text(max_length=limits.PROMPT_MAX_CHARS) | None = None  # type: ignore[valid-type]
    credential_id: whole(1, MAX_ID, description="one of your stored keys (GET /v1/credentials)") | None = None  # type: ignore[valid-type]
    base_url: (
        Annotated[
            str,
            BeforeValidator(_base_url),
            Field(
                json_schema_extra={"pattern": "^$|^https?://[^\\u0000]*$", "maxLength": limits.PATH_MAX_CHARS},
                description="http(s)://…, or empty",
            ),
        ]
        | None
    ) = None
    tools: ToolNames | None = None
    command_allow: Strings | None = None
    command_deny: Strings | None = None
    approval_tools: ToolNames | None = None
    max_tool_turns: _bounded("max_tool_turns") | None = None  # type: ignore[valid-type]
    max_output_tokens: _bounded("max_output_tokens") | None = None  # type: ignore[valid-type]
    tool_timeout_seconds: _bounded("tool_timeout_seconds") | None = None  # type: ignore[valid-type]
    protected_paths: Strings | None = None
    protect_defaults: flag() | None = None  # type: ignore[valid-type]
    network: flag() | None = None  # type: ignore[valid-type]
    mcp_servers: McpServers | None = None
    # Grading: a person without run_programs may set these too (`capabilities.SAFE_OVERRIDES`).
    judge_rubric: text(max_length=limits.PROMPT_MAX_CHARS, description="acceptance criteria an independent Claude judge grades each done against; empty: no judge") | None = None  # type: ignore[valid-type]
    judge_model: text(max_length=limits.NAME_MAX_CHARS, description="the judge's model (it must have a price); empty: the agent's") | None = None  # type: ignore[valid-type]
    judge_pass_threshold: whole(0, 100, between=True, description="the judge's score (0-100) a pass needs; 0: its verdict alone") | None = None  # type: ignore[valid-type]
    response_schema: ResponseSchema | None = None
    # Stall handling: a person without run_programs may set it too (`capabilities.SAFE_OVERRIDES`).
    rewind_on_stall: flag(description="when progress stalls after a nudge, restore the workspace once to its best iteration's snapshot and ask for a different approach") | None = None  # type: ignore[valid-type]


class InstanceIn(InstanceChange):
    """An instance's fields: `name`, and a template to start from or the whole agent by hand."""

    name: Name
    template: text(max_length=limits.TEMPLATE_NAME_MAX_CHARS, description="a template's name; the other fields override it") | None = None  # type: ignore[valid-type]

    model_config = {
        # Made by hand (no template), a command brain (the default) needs its command.
        "json_schema_extra": {
            "if": {
                "not": {
                    "anyOf": [
                        {"required": ["template"], "properties": {"template": {"type": "string"}}},
                        {
                            "required": ["brain"],
                            "properties": {"brain": {"const": str(InstanceModel.Brain.ANTHROPIC)}},
                        },
                    ]
                }
            },
            "then": {"required": ["command"], "properties": {"command": {"type": "array", "minItems": 1}}},
        },
    }

    @model_validator(mode="after")
    def _command_brain_has_its_command(self, info: ValidationInfo) -> InstanceIn:
        context = info.context or {}
        from_template = context.get("from_template", self.template is not None)
        if not from_template and (self.brain or InstanceModel.Brain.COMMAND) == InstanceModel.Brain.COMMAND:
            if not self.command:
                raise refuse(f"command must be {ARGV}")
        return self


class Instance(Schema):
    id: int
    name: str
    brain: str
    command: list[str]
    env: dict[str, str]
    workspace: str
    checks: list[dict[str, Any]]
    decider: str
    max_iterations: int
    objective_max_chars: int
    act_timeout_seconds: int
    template: str | None
    model: str
    system_prompt: str
    key_source: str
    base_url: str
    tools: list[str]
    command_allow: list[str]
    command_deny: list[str]
    approval_tools: list[str]
    max_tool_turns: int
    max_output_tokens: int
    tool_timeout_seconds: int
    protected_paths: list[str]
    protect_defaults: bool
    protected: list[str] = Field(description="everything protected: protected_paths and, with checks, the defaults")
    network: bool
    mcp_servers: list[str]
    judge_rubric: str
    judge_model: str
    judge_pass_threshold: int | None
    response_schema: dict[str, Any] | None
    rewind_on_stall: bool
    created_at: str
    archived_at: str | None


class Instances(Schema):
    instances: list[Instance]


class Template(Schema):
    """An agent template: its configuration (what an instance made from it gets), its composition, its use."""

    name: str
    description: str
    role: bool = Field(description="a composition names it as a role: delegate starts it, not a person")
    roles: dict[str, str] = Field(description="a composition's roles: role -> template name")
    verify_with_role: str | None = Field(description="a composition's done is verified only by this role's pass")
    brain: str
    model: str
    system_prompt: str
    tools: list[str]
    decider: str
    max_iterations: int
    objective_max_chars: int
    checks: list[dict[str, Any]]
    command: list[str]
    command_allow: list[str]
    command_deny: list[str]
    approval_tools: list[str]
    max_tool_turns: int
    max_output_tokens: int
    tool_timeout_seconds: int
    act_timeout_seconds: int
    protected_paths: list[str]
    protect_defaults: bool
    mcp_servers: list[str]
    judge_rubric: str
    judge_model: str
    judge_pass_threshold: int | None
    response_schema: dict[str, Any] | None
    rewind_on_stall: bool
    usable: bool = Field(description="an instance made from it as it is would be kept (its models have prices)")


class Templates(Schema):
    templates: list[Template]


KEY_CHARS = limits.KEY_CHARS  # how long a stored model key may be (`validation.key_problem` checks its shape too)


class CredentialIn(Body):
    label: Name
    secret: Annotated[  # the shape `validation.key_problem` checks, stated in the schema
        text(min_length=1, max_length=KEY_CHARS[1], description="write-only: never shown again; an Anthropic key, sk-ant-…"),  # type: ignore[valid-type]
        Field(json_schema_extra={
            "pattern": f"^sk-ant-[A-Za-z0-9_-]{{{KEY_CHARS[0] - 7},{KEY_CHARS[1] - 7}}}$",
            "minLength": KEY_CHARS[0], "maxLength": KEY_CHARS[1],
        }),
    ]


class Credential(Schema):
    id: int
    label: str
    last4: str
    created_at: str


class Credentials(Schema):
    credentials: list[Credential]


class Deleted(Schema):
    deleted: int
