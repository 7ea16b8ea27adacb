from django import forms
from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User

from audit.trail import AuditedAdmin
from budgets.pricing import UnpricedModel
from instances import capabilities, prices, validation
from instances.models import AgentConfig, AgentTemplate, Credential, Instance, McpServer
from instances.services import fit_to_brain


class CredentialForm(forms.ModelForm):
    """The key is write-only: typed in, never rendered back (only its last four characters show).

    Its label and key are held to the rules of every other surface (`validation.invisible`,
    `validation.key_problem`)."""

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

    def clean_label(self):
        label = (self.cleaned_data.get("label") or "").strip()
        if why := validation.invisible(label):
            raise forms.ValidationError(f"label {why}")
        return label

    def clean_secret(self):
        secret = self.cleaned_data.get("secret") or ""
        if secret and (why := validation.key_problem(secret)):
            raise forms.ValidationError(why)
        return secret

    def clean(self):
        cleaned = super().clean()
        if not self.instance.pk and not cleaned.get("secret") and "secret" not in self.errors:
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
class CredentialAdmin(AuditedAdmin, admin.ModelAdmin):
    audit_noun = "credential"
    audit_verbs = ("add", "update", "remove")
    form = CredentialForm
    list_display = ["label", "owner", "masked", "created_at"]
    list_filter = ["owner"]
    search_fields = ["label", "owner__username"]
    readonly_fields = ["masked", "created_at"]

    @admin.display(description="key")
    def masked(self, obj: Credential) -> str:
        return f"…{obj.last4}" if obj.last4 else "—"


@admin.register(AgentTemplate)
class AgentTemplateAdmin(AuditedAdmin, admin.ModelAdmin):
    audit_noun = "template"
    list_display = ["name", "brain", "model", "decider", "max_iterations", "source", "updated_at"]
    search_fields = ["name", "description"]
    readonly_fields = ["source", "updated_at"]
    fieldsets = [
        (None, {"fields": ["name", "description"]}),
        ("What an instance made from it gets", {"fields": list(AgentConfig.config_fields())}),
        ("Composition", {"fields": ["roles", "verify_with_role"]}),
        (None, {"fields": ["source", "updated_at"]}),
    ]


class InstanceForm(forms.ModelForm):
    """Refuses a model with no price for an instance that calls Claude (its cost could not be capped),
    a workspace that nests with another instance's (`validation.check_workspace_apart`), and a
    name its owner already uses or a configuration that cannot run (`validation.check_saved`)."""

    price_refused = False
    workspace_refused = False
    saved_refused = False

    class Meta:
        model = Instance
        fields = ["name", "brain", "decider", "model"]  # the admin adds the rest from its fieldsets

    def clean(self):
        cleaned = super().clean()
        probe = Instance(
            name=cleaned.get("name") or self.instance.name,
            **{f: cleaned.get(f, getattr(self.instance, f)) for f in ("brain", "decider", "model", "judge_rubric", "judge_model")},
        )
        try:
            prices.ensure_priced(probe)
        except UnpricedModel as exc:
            self.price_refused = True
            self.add_error(exc.field if exc.field in self.fields else None, str(exc))
        self._check_workspace(cleaned)
        self._check_saved(cleaned)
        return cleaned

    def _check_saved(self, cleaned: dict) -> None:
        """Check the name (when new or changed) and, when new or changed, what it runs: as the API and console do."""
        fields = ("name", "owner", "brain", "command", "workspace")
        if any(f in self.errors for f in fields):
            return
        values = {f: cleaned.get(f, getattr(self.instance, f, None)) for f in fields}
        if values["owner"] is None:
            return
        probe = Instance(pk=self.instance.pk, **values)
        new = not self.instance.pk
        try:
            validation.check_saved(
                probe,
                name=new or bool({"name", "owner"} & set(self.changed_data)),
                program=new or bool({"brain", "command", "workspace"} & set(self.changed_data)),
            )
        except validation.InvalidInstance as exc:
            self.saved_refused = True
            self.add_error(exc.field if exc.field in self.fields else None, exc.message)

    def _check_workspace(self, cleaned: dict) -> None:
        """Check a new instance's workspace, or a changed workspace or owner.

        A new instance's default workspace is known only once it has an id: runs check it then.
        """
        workspace = cleaned.get("workspace", self.instance.workspace)
        owner = cleaned.get("owner")
        changed = not self.instance.pk or {"workspace", "owner"} & set(self.changed_data)
        if owner is None or not changed or not (workspace or self.instance.pk):
            return
        try:
            validation.check_workspace_apart(Instance(pk=self.instance.pk, owner=owner, workspace=workspace))
        except validation.InvalidInstance as exc:
            self.workspace_refused = True
            self.add_error("workspace" if "workspace" in self.fields else None, exc.message)


@admin.register(Instance)
class InstanceAdmin(AuditedAdmin, admin.ModelAdmin):
    audit_noun = "instance"
    form = InstanceForm
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
                    "tools", "mcp_servers", "command_allow", "command_deny", "approval_tools", "max_tool_turns",
                    "max_output_tokens", "tool_timeout_seconds", "act_timeout_seconds", "objective_max_chars",
                ]
            },
        ),
        ("Command brain and checks", {"fields": ["command", "env", "checks", "protected_paths", "protect_defaults", "network"]}),
        ("Grading", {"fields": ["judge_rubric", "judge_model", "judge_pass_threshold", "response_schema"]}),
        ("Stall handling", {"fields": ["rewind_on_stall"]}),
    ]
    # Every setting is checked against the user's capabilities (the safe ones pass), so a new field
    # needs run_programs until `capabilities.SAFE_OVERRIDES` says otherwise.
    CHECKED = (*Instance.setting_fields(), "template")

    def get_form(self, request, obj=None, change=False, **kwargs):
        """Return the instance form, checking the fields the user sets against their capabilities."""
        base = super().get_form(request, obj, change=change, **kwargs)
        user = request.user
        checked = self.CHECKED

        class CapabilityCheckedForm(base):  # type: ignore[misc, valid-type]
            capability_refused = False

            def clean(self):
                cleaned = super().clean()
                current = self.instance if self.instance.pk else Instance()
                values = {
                    f: cleaned[f] for f in checked
                    if f in cleaned and (not self.instance.pk or f in self.changed_data)
                    and cleaned[f] != getattr(current, f, None)
                }
                values = {f: v for f, v in values.items() if v not in ("", None, [], {}, False)
                          or self.instance.pk}
                template = cleaned.get("template") or getattr(self.instance, "template", None)
                values.pop("template", None)
                try:
                    capabilities.check_instance(user, values, template=template)
                except capabilities.CapabilityError as exc:
                    self.capability_refused = True
                    raise forms.ValidationError(str(exc)) from None
                except validation.InvalidInstance as exc:  # e.g. mcp_servers that are not server names
                    raise forms.ValidationError(exc.message) from None
                return cleaned

        return CapabilityCheckedForm

    def render_change_form(self, request, context, *args, **kwargs):
        response = super().render_change_form(request, context, *args, **kwargs)
        form = context.get("adminform").form if context.get("adminform") else None
        if getattr(form, "capability_refused", False):
            response.status_code = 403  # refused, not merely invalid: nothing was saved
        elif any(getattr(form, flag, False) for flag in ("price_refused", "workspace_refused", "saved_refused")):
            response.status_code = 400  # no price, a nesting workspace, a name taken, cannot run: nothing was saved
        return response

    def save_model(self, request, obj, form, change):
        fit_to_brain(obj)  # a program brain keeps no model, prompt or Claude tools, as on every surface
        super().save_model(request, obj, form, change)


def _pairs(text: str, separator: str, what: str) -> dict[str, str]:
    """Return the `NAME<separator>value` lines of `text` as a dict, or raise ValidationError."""
    found: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, sep, value = line.partition(separator)
        if not sep or not name.strip():
            raise forms.ValidationError(f"line {number}: write {what}")
        found[name.strip()] = value.strip()
    return found


class McpServerForm(forms.ModelForm):
    """An MCP server's secrets are write-only: typed in, stored encrypted, only their names shown."""

    secret_env = forms.CharField(
        label="Environment (secret)", required=False, strip=False,
        widget=forms.Textarea(attrs={"rows": 3, "autocomplete": "off"}),
        help_text="stdio: NAME=value lines given to the server's program. Stored encrypted; never shown again. "
        "Leave blank to keep what is stored.",
    )
    secret_headers = forms.CharField(
        label="HTTP headers (secret)", required=False, strip=False,
        widget=forms.Textarea(attrs={"rows": 2, "autocomplete": "off"}),
        help_text="http: 'Name: value' lines sent with every request (e.g. Authorization: Bearer …). "
        "Stored encrypted; leave blank to keep what is stored.",
    )
    clear_secrets = forms.BooleanField(required=False, help_text="forget the stored environment and headers")

    class Meta:
        model = McpServer
        fields = [
            "name", "description", "transport", "command", "url", "allow_private_url", "tool_allow", "tool_deny",
            "approval_tools", "timeout_seconds", "enabled", "everyone", "users", "groups",
        ]

    def clean(self):
        cleaned = super().clean()
        transport = cleaned.get("transport")
        for field in ("command", "tool_allow", "tool_deny", "approval_tools"):
            value = cleaned.get(field)
            if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) and v for v in value)):
                self.add_error(field, "Enter a JSON list of non-empty strings.")
        if transport == McpServer.Transport.STDIO and not cleaned.get("command"):
            self.add_error("command", 'A stdio server needs its command: a JSON argv like ["/opt/mcp/notes", "--stdio"].')
        if transport == McpServer.Transport.HTTP:
            url = (cleaned.get("url") or "").strip()
            try:
                cleaned["url"] = capabilities.check_url(
                    url, field="url", allow_private=bool(cleaned.get("allow_private_url"))
                )
            except capabilities.CapabilityError as exc:
                self.add_error("url", str(exc))
        try:
            self.env = _pairs(cleaned.get("secret_env") or "", "=", "NAME=value")
        except forms.ValidationError as exc:
            self.add_error("secret_env", exc)
        try:
            self.headers = _pairs(cleaned.get("secret_headers") or "", ":", "Name: value")
        except forms.ValidationError as exc:
            self.add_error("secret_headers", exc)
        return cleaned

    def save(self, commit=True):
        server = super().save(commit=False)
        if self.cleaned_data.get("clear_secrets"):
            server.set_secrets()
        elif self.env or self.headers:
            kept = server.secrets() if server.secrets_encrypted else {"env": {}, "headers": {}}
            server.set_secrets(env=self.env or kept["env"], headers=self.headers or kept["headers"])
        if commit:
            server.save()
            self.save_m2m()
        return server


@admin.register(McpServer)
class McpServerAdmin(AuditedAdmin, admin.ModelAdmin):
    audit_noun = "mcp_server"
    """The MCP servers agents may be given: registered by an operator, enabled per instance by its owner."""

    form = McpServerForm
    list_display = ["name", "transport", "enabled", "everyone", "stored_secrets", "updated_at"]
    list_filter = ["transport", "enabled", "everyone"]
    search_fields = ["name", "description"]
    filter_horizontal = ["users", "groups"]
    readonly_fields = ["stored_secrets", "updated_at"]
    fieldsets = [
        (None, {"fields": ["name", "description", "transport", "enabled"]}),
        ("stdio (runs in the agent's sandbox)", {"fields": ["command", "secret_env"]}),
        ("Streamable HTTP", {"fields": ["url", "allow_private_url", "secret_headers"]}),
        ("Secrets", {"fields": ["stored_secrets", "clear_secrets"]}),
        ("Guardrails", {"fields": ["tool_allow", "tool_deny", "approval_tools", "timeout_seconds"]}),
        ("Who may enable it", {"fields": ["everyone", "users", "groups"]}),
        (None, {"fields": ["updated_at"]}),
    ]

    @admin.display(description="stored secrets")
    def stored_secrets(self, obj: McpServer) -> str:
        return ", ".join(obj.secret_names) if obj.secret_names else "—"


# Capabilities are permissions held by users and groups (`capabilities.PERMISSION`): granting or
# taking one back in the admin is recorded like every other change that shapes what agents may do.
admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(User)
class AuditedUserAdmin(AuditedAdmin, UserAdmin):
    audit_noun = "user"


@admin.register(Group)
class AuditedGroupAdmin(AuditedAdmin, GroupAdmin):
    audit_noun = "group"
