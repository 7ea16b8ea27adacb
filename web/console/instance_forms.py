"""Console forms for configuring instances and adding credentials.

They only parse what a person typed into the values `instances.services` takes (argv lists,
checks, variables); every rule (bounds, capabilities, templates, prices) lives there. A user
without the run_programs capability gets only the fields `capabilities.SAFE_OVERRIDES` allows.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from django import forms

from instances import capabilities
from instances.models import Credential, Instance, McpServer
from instances.tools import TOOLS
from tether import limits

LIST_FIELDS = ("command_allow", "command_deny", "protected_paths")
# What the template (or the operator) fixes, as the read-only summary shows it, in this order.
FIXED_LABELS = {
    "brain": "Brain",
    "decider": "Decider",
    "system_prompt": "System prompt",
    "tools": "Tools",
    "approval_tools": "Tools that need your approval",
    "command": "Command",
    "checks": "Checks",
    "command_allow": "Allowed commands",
    "command_deny": "Refused commands",
    "protected_paths": "Protected paths",
    "protect_defaults": "Default evidence protected",
    "tool_timeout_seconds": "Timeout per shell command",
    "act_timeout_seconds": "Timeout per act",
    "base_url": "Model endpoint",
    "network": "Network",
}
_CHECK_LINE = re.compile(r"^(?P<name>[^:\[]+?)\s*(?P<flags>(\[[^\]]*\]\s*)*):\s*(?P<command>.+)$")


def _tools() -> list[tuple[str, str]]:
    return [(name, name.replace("_", " ")) for name in TOOLS]


def _mcp_servers(user: Any, current: list[str]) -> list[tuple[str, str]]:
    """Return the MCP servers `user` may enable, plus the ones already enabled, as (name, label) choices."""
    names = [s.name for s in McpServer.objects.filter(enabled=True) if capabilities.may_use_mcp_server(user, s)]
    names += [n for n in current if n not in names]
    described = dict(McpServer.objects.filter(name__in=names).values_list("name", "description"))
    return [(n, f"{n}: {described[n]}" if described.get(n) else n) for n in names]


def checks_text(checks: list[dict[str, Any]]) -> str:
    """Return `checks` as the form shows them: `name [optional] [timeout=60]: command`, one a line."""
    lines = []
    for check in checks or []:
        flags = "" if check.get("required", True) else " [optional]"
        if "timeout" in check:
            flags += f" [timeout={check['timeout']:g}]"
        if check.get("evidence") == "report":
            flags += " [report]"
        lines.append(f"{check['name']}{flags}: {shlex.join(check['command'])}")
    return "\n".join(lines)


def parse_checks(text: str) -> list[dict[str, Any]]:
    """Return the checks written one a line as `name [optional] [timeout=60]: command args`."""
    checks = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        match = _CHECK_LINE.match(line.strip())
        if not match:
            raise forms.ValidationError(
                f"Line {number}: write a check as 'name: command', e.g. 'tests: python -m pytest -q'."
            )
        check: dict[str, Any] = {"name": match["name"].strip(), "command": _words(match["command"], f"Line {number}")}
        for flag in re.findall(r"\[([^\]]*)\]", match["flags"] or ""):
            flag = flag.strip()
            if flag == "optional":
                check["required"] = False
            elif flag == "report":
                check["evidence"] = "report"
            elif flag.startswith("timeout="):
                try:
                    check["timeout"] = float(flag.removeprefix("timeout="))
                except ValueError:
                    raise forms.ValidationError(f"Line {number}: the timeout must be a number of seconds.") from None
                if check["timeout"].is_integer():
                    check["timeout"] = int(check["timeout"])
            else:
                raise forms.ValidationError(f"Line {number}: unknown [{flag}]; use [optional], [report] or [timeout=SECONDS].")
        checks.append(check)
    return checks


def _words(text: str, where: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise forms.ValidationError(f"{where}: {exc} (quote words with spaces like a shell does).") from None


def parse_env(text: str) -> dict[str, str]:
    """Return the variables written one a line as NAME=value."""
    env = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, sep, value = line.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name.strip()):
            raise forms.ValidationError(f"Line {number}: write a variable as NAME=value.")
        env[name.strip()] = value
    return env


class InstanceForm(forms.Form):
    """An instance's settings. Built per user: without the capability, only the safe fields."""

    name = forms.CharField(strip=True, error_messages={"required": "Give the instance a name."})
    model = forms.CharField(
        required=False, strip=True, label="Model",
        widget=forms.TextInput(attrs={"list": "priced-models", "autocomplete": "off", "spellcheck": "false"}),
        help_text="a model Tether has a price for (the list suggests them); blank: the default model",
    )
    credential = forms.ModelChoiceField(
        queryset=Credential.objects.none(), required=False, label="API key",
        empty_label="none: the server's key, if it has one",
    )
    max_iterations = forms.IntegerField(label="Max iterations per run")
    objective_max_chars = forms.IntegerField(label="Longest objective (characters)")
    max_tool_turns = forms.IntegerField(label="Tool turns per act")
    max_output_tokens = forms.IntegerField(label="Output tokens per act")
    workspace = forms.CharField(
        required=False, strip=True, label="Workspace",
        help_text="an absolute path in your area; blank: its own directory",
    )
    mcp_servers = forms.MultipleChoiceField(
        required=False, widget=forms.CheckboxSelectMultiple, label="MCP servers",
        help_text="tool servers an operator granted you; the agent gets their tools as mcp__<server>__<tool>",
    )
    # How a done is graded (reviews.graders): safe fields too, since they run no program.
    judge_rubric = forms.CharField(
        required=False, strip=True, label="Judge's rubric", widget=forms.Textarea(attrs={"rows": 3}),
        help_text="acceptance criteria an independent Claude judge grades each done against; blank: no judge",
    )
    judge_model = forms.CharField(
        required=False, strip=True, label="Judge's model",
        widget=forms.TextInput(attrs={"list": "priced-models", "autocomplete": "off", "spellcheck": "false"}),
        help_text="a model Tether has a price for; blank: the agent's model",
    )
    judge_pass_threshold = forms.IntegerField(
        required=False, min_value=0, max_value=100, label="Judge's pass threshold",
        help_text="the score (0-100) a pass needs; 0 or blank: the judge's verdict alone",
    )
    response_schema = forms.CharField(
        required=False, label="Response schema",
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        help_text='a JSON Schema the final answer must satisfy, like {"type": "object", "required": ["answer"]}; blank: none',
    )
    # Stall handling (loops.policy): a safe field, it runs no program.
    rewind_on_stall = forms.BooleanField(
        required=False, label="Rewind to the best iteration when it stalls",
        help_text="after a nudge, go back once to the workspace as its best iteration left it (an undoable rollback) "
        "and ask for a different approach, before a person is asked",
    )
    # The operator's fields (the run_programs capability).
    brain = forms.ChoiceField(
        choices=[(Instance.Brain.ANTHROPIC, "Claude (anthropic)"), (Instance.Brain.COMMAND, "a program (command)")]
    )
    decider = forms.ChoiceField(
        choices=[(Instance.Decider.LLM, "Claude judges each iteration (llm)"),
                 (Instance.Decider.CHECKS, "done when the required checks pass (checks)")]
    )
    system_prompt = forms.CharField(required=False, strip=True, widget=forms.Textarea(attrs={"rows": 5}))
    tools = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple)
    approval_tools = forms.MultipleChoiceField(
        required=False, widget=forms.CheckboxSelectMultiple, label="Tools that need your approval"
    )
    command = forms.CharField(
        required=False, strip=True, label="Command",
        help_text="the program a command brain runs, written as in a shell: my-agent --fast",
    )
    checks = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        help_text="one a line: name [optional] [timeout=SECONDS]: command",
    )
    env = forms.CharField(
        required=False, label="Environment",
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false", "autocomplete": "off"}),
        help_text="NAME=value, one a line; values are never shown again",
    )
    env_clear = forms.BooleanField(required=False, label="Remove every variable")
    command_allow = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 2}), label="Allowed commands",
        help_text="one pattern a line; none: any command",
    )
    command_deny = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 2}), label="Refused commands", help_text="one a line"
    )
    protected_paths = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 2}), label="Protected paths",
        help_text="globs of the files that grade the agent, one a line",
    )
    protect_defaults = forms.BooleanField(
        required=False, initial=True, label="Also protect the default evidence",
        help_text="with checks: tests, runner configuration, runner-shadowing modules, .gitignore (see the README)",
    )
    tool_timeout_seconds = forms.IntegerField(label="Timeout per shell command (s)")
    act_timeout_seconds = forms.IntegerField(label="Timeout per act (s)")
    base_url = forms.CharField(required=False, strip=True, label="Model endpoint (base URL)", help_text="blank: the server's")
    network = forms.BooleanField(required=False, label="Let its programs reach the network")

    SAFE = tuple(f for f in ("name", "model", "credential", "max_iterations", "objective_max_chars",
                             "max_tool_turns", "max_output_tokens", "workspace", "mcp_servers",
                             "judge_rubric", "judge_model", "judge_pass_threshold", "response_schema",
                             "rewind_on_stall")
                 if f in capabilities.SAFE_OVERRIDES)

    # What only a Claude brain uses: hidden when the brain is a program (see console.css), and not
    # kept on save (`services.fit_to_brain`).
    CLAUDE_ONLY = ("model", "system_prompt", "tools", "approval_tools", "max_tool_turns", "max_output_tokens")
    # What the blank environment keeps, by what the form does.
    ENV_KEPT = {"edit": "the current ones", "duplicate": "the copied instance's"}

    def __init__(
        self, *args: Any, user: Any, full: bool, initial: dict[str, Any], purpose: str = "create", **kwargs: Any
    ) -> None:
        super().__init__(*args, initial=self.initial_from(initial), **kwargs)
        self.full = full
        self.purpose = purpose
        kept = self.ENV_KEPT.get(purpose)
        if kept:
            self.fields["env"].help_text += f". Blank: keep {kept}"
        if not kept or not (initial or {}).get("env"):
            del self.fields["env_clear"]  # nothing to remove
        self.fields["credential"].queryset = Credential.objects.filter(owner=user).order_by("label")
        self.fields["tools"].choices = self.fields["approval_tools"].choices = _tools()
        servers = _mcp_servers(user, (initial or {}).get("mcp_servers") or [])
        self.fields["mcp_servers"].choices = servers
        if not servers:  # nothing granted: nothing to show (a posted name is still refused as invalid)
            self.fields["mcp_servers"].widget = forms.MultipleHiddenInput()
        if not full:
            for name in list(self.fields):
                if name not in self.SAFE:
                    del self.fields[name]
            if (initial or {}).get("brain") == Instance.Brain.COMMAND:  # a program: no tool turns
                unused = ["max_tool_turns", "max_output_tokens"]
                if (initial or {}).get("decider") != Instance.Decider.LLM:
                    unused.append("model")  # nor a model, unless Claude judges it
                for name in unused:
                    self.fields.pop(name, None)
        else:
            self.fields["brain"].widget.attrs["data-brain-switch"] = ""
        for field in self.fields.values():
            if isinstance(field, forms.IntegerField):
                field.widget.attrs.setdefault("inputmode", "numeric")
                field.error_messages["invalid"] = f"{field.label or 'This'} must be a whole number."

    @classmethod
    def initial_from(cls, values: dict[str, Any]) -> dict[str, Any]:
        """Return form initial data for instance field values (lists and argv as text; env never)."""
        initial = {k: v for k, v in values.items() if k != "env"}
        if "command" in values:
            initial["command"] = shlex.join(values["command"] or [])
        if "checks" in values:
            initial["checks"] = checks_text(values["checks"])
        for name in LIST_FIELDS:
            if name in values:
                initial[name] = "\n".join(values[name] or [])
        if "response_schema" in values:
            initial["response_schema"] = json.dumps(values["response_schema"], indent=2) if values["response_schema"] else ""
        return initial

    def clean_response_schema(self) -> dict[str, Any] | None:
        """Return the typed schema as a JSON object (None for none); the service checks it is a JSON Schema."""
        text = self.cleaned_data["response_schema"].strip()
        if not text:
            return None
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise forms.ValidationError(f"The response schema must be JSON: {exc}.") from None
        if not isinstance(value, dict):
            raise forms.ValidationError('The response schema must be a JSON object, like {"type": "object"}.')
        return value

    def clean_command(self) -> list[str]:
        return _words(self.cleaned_data["command"], "Command")

    def clean_checks(self) -> list[dict[str, Any]]:
        return parse_checks(self.cleaned_data["checks"])

    def clean_env(self) -> dict[str, str] | None:
        text = self.cleaned_data["env"]
        return parse_env(text) if text.strip() else None

    def _lines(self, name: str) -> list[str]:
        return [line.strip() for line in self.cleaned_data[name].splitlines() if line.strip()]

    def clean_command_allow(self) -> list[str]:
        return self._lines("command_allow")

    def clean_command_deny(self) -> list[str]:
        return self._lines("command_deny")

    def clean_protected_paths(self) -> list[str]:
        return self._lines("protected_paths")

    def values(self) -> dict[str, Any]:
        """Return the instance field values the form sets (env only when typed or cleared)."""
        values = dict(self.cleaned_data)
        clear = values.pop("env_clear", False)
        if values.get("env") is None:
            values.pop("env", None)
        if clear:
            values["env"] = {}
        return values


class CredentialForm(forms.Form):
    """A key to store: write-only, so the key field never renders a value back."""

    label = forms.CharField(
        strip=True, max_length=limits.NAME_MAX_CHARS,
        error_messages={"required": "Label the key, like 'personal' or 'team'.",
                        "max_length": "A label can be at most %(limit_value)d characters; this one has %(show_value)d."},
    )
    secret = forms.CharField(
        strip=True, label="Anthropic API key",
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off", "spellcheck": "false"}),
        error_messages={"required": "Paste the API key."},
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # No maxlength: a browser would cut a longer label silently; the server refuses it, saying so.
        self.fields["label"].widget.attrs.pop("maxlength", None)
