from pathlib import Path

from django.conf import settings
from django.db import models


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
    brain = models.CharField(max_length=20, choices=Brain.choices, default=Brain.COMMAND)
    command = models.JSONField(default=list, blank=True, help_text="argv list for the command brain")
    env = models.JSONField(default=dict, blank=True, help_text="extra variables given to the command")
    workspace = models.CharField(max_length=500, blank=True)
    checks = models.JSONField(default=list, blank=True, help_text="[{name, command: [argv], required}]")
    decider = models.CharField(max_length=20, choices=Decider.choices, default=Decider.CHECKS)
    max_iterations = models.PositiveIntegerField(default=10)
    objective_max_chars = models.PositiveIntegerField(default=8000)
    act_timeout_seconds = models.PositiveIntegerField(default=600)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.name

    def workspace_path(self) -> Path:
        if self.workspace:
            return Path(self.workspace)
        return settings.TETHER_WORKSPACES / f"instance-{self.pk}"
