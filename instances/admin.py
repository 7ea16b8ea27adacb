from django import forms
from django.contrib import admin

from instances.models import AgentTemplate, Credential, Instance


class CredentialForm(forms.ModelForm):
    """The key is write-only: typed in, never rendered back (only its last four characters show)."""

    secret = forms.CharField(
        label="API key",
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
        help_text="Stored encrypted. Leave blank to keep the current key.",
    )

    class Meta:
        model = Credential
        fields = ["owner", "label"]

    def clean(self):
        cleaned = super().clean()
        if not self.instance.pk and not cleaned.get("secret"):
            self.add_error("secret", "Enter the API key.")
        return cleaned

    def save(self, commit=True):
        credential = super().save(commit=False)
        if secret := self.cleaned_data.get("secret"):
            credential.set_secret(secret)
        if commit:
            credential.save()
        return credential


@admin.register(Credential)
class CredentialAdmin(admin.ModelAdmin):
    form = CredentialForm
    list_display = ["label", "owner", "masked", "created_at"]
    list_filter = ["owner"]
    search_fields = ["label", "owner__username"]
    readonly_fields = ["masked", "created_at"]

    @admin.display(description="key")
    def masked(self, obj: Credential) -> str:
        return f"…{obj.last4}" if obj.last4 else "—"


@admin.register(AgentTemplate)
class AgentTemplateAdmin(admin.ModelAdmin):
    list_display = ["name", "brain", "model", "decider", "max_iterations", "source", "updated_at"]
    search_fields = ["name", "description"]
    readonly_fields = ["source", "updated_at"]


@admin.register(Instance)
class InstanceAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "brain", "template", "model", "decider", "max_iterations", "created_at"]
    list_filter = ["brain", "decider", "template"]
    search_fields = ["name", "owner__username"]
    raw_id_fields = ["owner"]
    fieldsets = [
        (None, {"fields": ["owner", "name", "template", "brain", "decider", "max_iterations", "workspace"]}),
        ("Claude", {"fields": ["model", "system_prompt", "credential", "base_url"]}),
        (
            "Guardrails",
            {
                "fields": [
                    "tools", "command_allow", "command_deny", "approval_tools", "max_tool_turns",
                    "max_output_tokens", "tool_timeout_seconds", "act_timeout_seconds", "objective_max_chars",
                ]
            },
        ),
        ("Command brain and checks", {"fields": ["command", "env", "checks"]}),
    ]
