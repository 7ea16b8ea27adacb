import json
import shlex
from pathlib import Path

from django.conf import settings
from django.core.validators import MaxValueValidator, RegexValidator
from django.db import models
from django.db.models.signals import post_migrate

from instances import credentials


class Credential(models.Model):
    """An Anthropic API key a user brought, encrypted at rest.

    The secret is write-only: it is set through `set_secret` (or `Credential.create_for`),
    stored as a Fernet token (see `instances.credentials`), and only its last four
    characters are ever shown. Nothing renders it back.
    """

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="credentials")
    label = models.CharField(max_length=100)
    secret_encrypted = models.TextField(editable=False)
    last4 = models.CharField(max_length=4, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["owner", "label"], name="credential_label_once_per_owner")]

    def __str__(self) -> str:
        return f"{self.label} (…{self.last4})"

    def __repr__(self) -> str:
        return f"<Credential {self.pk} {self.label!r} …{self.last4}>"

    @classmethod
    def create_for(cls, owner, *, label: str, secret: str) -> "Credential":
        credential = cls(owner=owner, label=label)
        credential.set_secret(secret)
        credential.save()
        return credential

    def set_secret(self, secret: str) -> None:
        secret = secret.strip()
        if not secret:
            raise ValueError("an API key cannot be empty")
        self.secret_encrypted = credentials.encrypt(secret)
        self.last4 = secret[-4:]

    def reveal(self) -> str:
        """Return the plaintext key. Only a brain building its client calls this."""
        return credentials.decrypt(self.secret_encrypted)


class AgentConfig(models.Model):
    """An agent's configuration: what a template fixes and an instance runs with (one definition each).

    `AgentTemplate` and `Instance` both derive from it, so the list of these fields is
    `config_fields()`: what an instance copies from its template, what the API shows and what
    may be overridden are derived from it, and tests/instances/test_agent_config.py holds the
    typed statements of it (the API's schemas, the template file schema, the forms) to it.
    """

    class Brain(models.TextChoices):
        COMMAND = "command"
        ANTHROPIC = "anthropic"

    class Decider(models.TextChoices):
        CHECKS = "checks"
        LLM = "llm"

    # A program judged by its checks unless told otherwise (a template says otherwise: see AgentTemplate).
    brain = models.CharField(max_length=20, choices=Brain.choices, default=Brain.COMMAND)
    model = models.CharField(max_length=100, blank=True, help_text="blank: the default model")
    system_prompt = models.TextField(blank=True)
    tools = models.JSONField(default=list, blank=True, help_text="enabled tool names, e.g. read_file, run_command")
    decider = models.CharField(max_length=20, choices=Decider.choices, default=Decider.CHECKS)
    max_iterations = models.PositiveIntegerField(default=10)
    # The longest objective a run may be given; without the run_programs capability a user may
    # set an instance's no higher than its template's (`capabilities.check_instance`).
    objective_max_chars = models.PositiveIntegerField(default=8000)
    checks = models.JSONField(default=list, blank=True, help_text="[{name, command: [argv], required}]")
    command = models.JSONField(default=list, blank=True, help_text="argv list for the command brain")
    # Guardrails.
    command_allow = models.JSONField(default=list, blank=True, help_text="allowed command patterns; empty: any")
    command_deny = models.JSONField(default=list, blank=True, help_text="refused command patterns")
    approval_tools = models.JSONField(default=list, blank=True, help_text="tools whose calls need a person")
    max_tool_turns = models.PositiveIntegerField(default=20, help_text="tool turns per act")
    max_output_tokens = models.PositiveIntegerField(default=16000, help_text="output tokens per act")
    tool_timeout_seconds = models.PositiveIntegerField(default=120, help_text="per shell command")
    act_timeout_seconds = models.PositiveIntegerField(default=600)
    protected_paths = models.JSONField(
        default=list, blank=True, help_text="globs relative to the workspace that grade the agent, e.g. tests/**"
    )
    protect_defaults = models.BooleanField(
        default=True,
        help_text="with checks, also protect the default evidence files (tests, runner configuration, .gitignore)",
    )
    mcp_servers = models.JSONField(
        default=list, blank=True, help_text="names of registered MCP servers whose tools the agent gets"
    )
    # Grading (`reviews.graders`): what a done must satisfy besides the required checks.
    judge_rubric = models.TextField(
        blank=True, help_text="acceptance criteria an independent Claude judge grades each done against; blank: no judge"
    )
    judge_model = models.CharField(max_length=100, blank=True, help_text="the judge's model; blank: the agent's")
    judge_pass_threshold = models.PositiveIntegerField(
        null=True, blank=True, validators=[MaxValueValidator(100)],
        help_text="the judge's score (0-100) a pass needs; blank or 0: its verdict alone",
    )
    response_schema = models.JSONField(
        null=True, blank=True, help_text="a JSON Schema the final answer (parsed as JSON) must satisfy"
    )
    # Stall handling (`loops.policy`): between the nudge and the escalation, go back once to the
    # workspace as the run's best iteration left it and ask for another approach.
    rewind_on_stall = models.BooleanField(
        default=False,
        help_text="when progress stalls after a nudge, restore the workspace once to its best iteration's snapshot "
        "and ask for a different approach",
    )

    class Meta:
        abstract = True

    @classmethod
    def config_fields(cls) -> tuple[str, ...]:
        """Return the names of the configuration fields, in declaration order."""
        return tuple(f.name for f in AgentConfig._meta.local_fields)


def _with_default(name: str, default: object) -> models.Field:
    """Return `AgentConfig`'s field `name` as it is, but for its default."""
    field = AgentConfig._meta.get_field(name)
    _, _, args, kwargs = field.deconstruct()
    return type(field)(*args, **{**kwargs, "default": default})


class AgentTemplate(AgentConfig):
    """An instance's configuration declared as data (`instances/agent_templates/*.json`)."""

    name = models.SlugField(max_length=50, unique=True)
    description = models.TextField(blank=True)
    # A template is Claude judging its own work unless its file says otherwise (`brain` is
    # required there; `decider` is not, so a file without one gets "llm").
    brain = _with_default("brain", AgentConfig.Brain.ANTHROPIC)
    decider = _with_default("decider", AgentConfig.Decider.LLM)
    # A composition: the roles this template's agent delegates to ({"planner": "pbq-planner", ...});
    # `delegate(to=ROLE)` starts a run of that role's template. With `verify_with_role`, a done is
    # verified only when that role's latest run passed (ended done).
    roles = models.JSONField(default=dict, blank=True, help_text='role -> template name, e.g. {"qa": "pbq-qa"}')
    verify_with_role = models.CharField(max_length=50, blank=True)
    source = models.CharField(max_length=200, blank=True, help_text="the data file it was loaded from")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def instance_defaults(self) -> dict:
        """Return the field values an instance created from this template starts with: its whole configuration."""
        return {name: getattr(self, name) for name in self.config_fields()}


class Instance(AgentConfig):
    """One agent: a brain, its checks, its workspace and its bounds."""

    # What is not a setting of the agent: who owns it, what it is called, where it came from, when.
    NOT_SETTINGS = frozenset({"id", "owner", "name", "template", "created_at", "updated_at", "archived_at"})

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="instances")
    name = models.CharField(max_length=100)
    template = models.ForeignKey(
        AgentTemplate, null=True, blank=True, on_delete=models.SET_NULL, related_name="instances"
    )
    # An instance's own settings, beyond the configuration a template gives.
    env = models.JSONField(default=dict, blank=True, help_text="extra variables given to the command")
    workspace = models.CharField(max_length=500, blank=True)
    credential = models.ForeignKey(
        Credential, null=True, blank=True, on_delete=models.SET_NULL, related_name="instances"
    )
    base_url = models.CharField(
        max_length=300, blank=True, help_text="blank: ANTHROPIC_BASE_URL from the environment, else Anthropic's own"
    )
    network = models.BooleanField(
        default=False, help_text="let its programs reach the outside network (never this machine's loopback)"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Bumped by every save: a live run's driver reads the instance again when it has changed.
    updated_at = models.DateTimeField(auto_now=True)
    # Set when its owner archives it: it leaves the fleet and starts no new run; its runs stay.
    archived_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        permissions = [
            (
                "run_programs",
                "Can define programs (command, checks, env), base_url, workspace paths and network egress",
            )
        ]

    def __str__(self) -> str:
        return self.name

    @classmethod
    def setting_fields(cls) -> tuple[str, ...]:
        """Return the fields a person sets on an instance: its configuration, then its own settings."""
        config = cls.config_fields()
        own = (f.name for f in cls._meta.concrete_fields if f.name not in (*config, *cls.NOT_SETTINGS))
        return (*config, *own)

    @property
    def command_line(self) -> str:
        """Return its command as a shell would take it, quotes and all (`shlex.join`)."""
        return shlex.join(str(a) for a in (self.command or []))

    def workspace_path(self) -> Path:
        if self.workspace:
            return Path(self.workspace)
        return Path(settings.TETHER_WORKSPACES) / str(self.owner_id) / str(self.pk)


class McpServer(models.Model):
    """An MCP server an operator registered: a capability agents may be given (`instances.mcp`).

    A `stdio` server is a program (an argv) that runs inside the sandbox of the agent using it,
    with its workspace and no network; an `http` server is a streamable-HTTP URL, held to the
    same address rules as an instance's `base_url`. Its secrets (the program's environment, the
    HTTP headers) are stored encrypted and are write-only. Who may enable it: everyone, or the
    users and groups named here (superusers always).
    """

    class Transport(models.TextChoices):
        STDIO = "stdio"
        HTTP = "http", "streamable HTTP"

    name = models.CharField(
        max_length=30, unique=True,
        validators=[RegexValidator(r"^[a-z0-9]+(?:[-_][a-z0-9]+)*$", "lower-case letters and digits, joined by single - or _")],
        help_text="its tools reach agents as mcp__<name>__<tool>; lower-case letters, digits, single - or _",
    )
    description = models.TextField(blank=True)
    transport = models.CharField(max_length=10, choices=Transport.choices, default=Transport.STDIO)
    command = models.JSONField(default=list, blank=True, help_text="stdio: the argv that starts the server")
    url = models.CharField(max_length=500, blank=True, help_text="http: the server's streamable-HTTP endpoint")
    allow_private_url = models.BooleanField(
        default=False, help_text="http: allow a loopback, link-local or private address (a server of your own)"
    )
    secrets_encrypted = models.TextField(blank=True, editable=False)
    secret_names = models.JSONField(default=list, blank=True, editable=False)
    tool_allow = models.JSONField(default=list, blank=True, help_text="tool name patterns offered; empty: all")
    tool_deny = models.JSONField(default=list, blank=True, help_text="tool name patterns never offered or run")
    approval_tools = models.JSONField(
        default=list, blank=True, help_text="tool name patterns whose every call needs a person's approval"
    )
    timeout_seconds = models.PositiveIntegerField(default=60, help_text="connecting, and each tool call")
    enabled = models.BooleanField(default=True, help_text="off: no agent connects to it")
    everyone = models.BooleanField(default=False, help_text="every user may enable it on their agents")
    users = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="mcp_servers")
    groups = models.ManyToManyField("auth.Group", blank=True, related_name="mcp_servers")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "MCP server"

    def __str__(self) -> str:
        return self.name

    def set_secrets(self, *, env: dict[str, str] | None = None, headers: dict[str, str] | None = None) -> None:
        """Store the program's environment and the HTTP headers encrypted; keep only their names readable."""
        data = {"env": dict(env or {}), "headers": dict(headers or {})}
        self.secrets_encrypted = credentials.encrypt(json.dumps(data)) if data["env"] or data["headers"] else ""
        self.secret_names = sorted([*(f"env {k}" for k in data["env"]), *(f"header {k}" for k in data["headers"])])

    def secrets(self) -> dict[str, dict[str, str]]:
        """Return {"env": {...}, "headers": {...}}. Only the connection to the server reads this."""
        if not self.secrets_encrypted:
            return {"env": {}, "headers": {}}
        data = json.loads(credentials.decrypt(self.secrets_encrypted))
        return {"env": dict(data.get("env") or {}), "headers": dict(data.get("headers") or {})}


# Shipped agent templates are recreated after migrate and after a test flush.
# (Connected here so it is registered whenever the app's models load.)
def _ensure_templates(sender, **kwargs):
    from instances.templates_loader import ensure_templates  # lazy: templates_loader imports these models

    ensure_templates(sender, **kwargs)


post_migrate.connect(_ensure_templates, dispatch_uid="instances.ensure_agent_templates")
