from pathlib import Path

from django.conf import settings
from django.db import models
from django.db.models.signals import post_migrate


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
        from instances import credentials

        secret = secret.strip()
        if not secret:
            raise ValueError("an API key cannot be empty")
        self.secret_encrypted = credentials.encrypt(secret)
        self.last4 = secret[-4:]

    def reveal(self) -> str:
        """Return the plaintext key. Only a brain building its client calls this."""
        from instances import credentials

        return credentials.decrypt(self.secret_encrypted)


class AgentTemplate(models.Model):
    """An instance's configuration declared as data (`instances/agent_templates/*.json`)."""

    name = models.SlugField(max_length=50, unique=True)
    description = models.TextField(blank=True)
    brain = models.CharField(max_length=20, default="anthropic")
    model = models.CharField(max_length=100, blank=True)
    system_prompt = models.TextField(blank=True)
    tools = models.JSONField(default=list, blank=True, help_text="tool names, e.g. read_file, run_command")
    decider = models.CharField(max_length=20, default="llm")
    max_iterations = models.PositiveIntegerField(default=10)
    checks = models.JSONField(default=list, blank=True, help_text="[{name, command: [argv], required}]")
    command = models.JSONField(default=list, blank=True, help_text="argv list for the command brain")
    command_allow = models.JSONField(default=list, blank=True)
    command_deny = models.JSONField(default=list, blank=True)
    approval_tools = models.JSONField(default=list, blank=True)
    max_tool_turns = models.PositiveIntegerField(default=20)
    max_output_tokens = models.PositiveIntegerField(default=16000)
    tool_timeout_seconds = models.PositiveIntegerField(default=120)
    act_timeout_seconds = models.PositiveIntegerField(default=600)
    source = models.CharField(max_length=200, blank=True, help_text="the data file it was loaded from")
    updated_at = models.DateTimeField(auto_now=True)

    # The fields an instance copies from its template (and may override).
    INSTANCE_FIELDS = (
        "brain",
        "model",
        "system_prompt",
        "tools",
        "decider",
        "max_iterations",
        "checks",
        "command",
        "command_allow",
        "command_deny",
        "approval_tools",
        "max_tool_turns",
        "max_output_tokens",
        "tool_timeout_seconds",
        "act_timeout_seconds",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def instance_defaults(self) -> dict:
        """Return the field values an instance created from this template starts with."""
        return {name: getattr(self, name) for name in self.INSTANCE_FIELDS}


class Instance(models.Model):
    """One agent: a brain, its checks, its workspace and its bounds."""

    class Brain(models.TextChoices):
        COMMAND = "command"
        ANTHROPIC = "anthropic"

    class Decider(models.TextChoices):
        CHECKS = "checks"
        LLM = "llm"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="instances")
    name = models.CharField(max_length=100)
    template = models.ForeignKey(
        AgentTemplate, null=True, blank=True, on_delete=models.SET_NULL, related_name="instances"
    )
    brain = models.CharField(max_length=20, choices=Brain.choices, default=Brain.COMMAND)
    command = models.JSONField(default=list, blank=True, help_text="argv list for the command brain")
    env = models.JSONField(default=dict, blank=True, help_text="extra variables given to the command")
    workspace = models.CharField(max_length=500, blank=True)
    checks = models.JSONField(default=list, blank=True, help_text="[{name, command: [argv], required}]")
    decider = models.CharField(max_length=20, choices=Decider.choices, default=Decider.CHECKS)
    max_iterations = models.PositiveIntegerField(default=10)
    objective_max_chars = models.PositiveIntegerField(default=8000)
    act_timeout_seconds = models.PositiveIntegerField(default=600)

    # The anthropic brain: model, prompt, key and endpoint.
    model = models.CharField(max_length=100, blank=True, help_text="blank: the default model")
    system_prompt = models.TextField(blank=True)
    credential = models.ForeignKey(
        Credential, null=True, blank=True, on_delete=models.SET_NULL, related_name="instances"
    )
    base_url = models.CharField(
        max_length=300, blank=True, help_text="blank: ANTHROPIC_BASE_URL from the environment, else Anthropic's own"
    )
    # Guardrails.
    tools = models.JSONField(default=list, blank=True, help_text="enabled tool names")
    command_allow = models.JSONField(default=list, blank=True, help_text="allowed command patterns; empty: any")
    command_deny = models.JSONField(default=list, blank=True, help_text="refused command patterns")
    approval_tools = models.JSONField(default=list, blank=True, help_text="tools whose calls need a person")
    max_tool_turns = models.PositiveIntegerField(default=20, help_text="tool turns per act")
    max_output_tokens = models.PositiveIntegerField(default=16000, help_text="output tokens per act")
    tool_timeout_seconds = models.PositiveIntegerField(default=120, help_text="per shell command")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.name

    def workspace_path(self) -> Path:
        if self.workspace:
            return Path(self.workspace)
        return settings.TETHER_WORKSPACES / f"instance-{self.pk}"


# Shipped agent templates are recreated after migrate and after a test flush.
# (Connected here so it is registered whenever the app's models load.)
def _ensure_templates(sender, **kwargs):
    from instances.templates_loader import ensure_templates

    ensure_templates(sender, **kwargs)


post_migrate.connect(_ensure_templates, dispatch_uid="instances.ensure_agent_templates")
