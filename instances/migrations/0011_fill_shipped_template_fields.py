from django.db import migrations

EMPTY = (None, "", [], {})


def fill(apps, schema_editor):
    """Give the shipped templates the fields added after they were first loaded (0003).

    0003 loaded every template file with the fields the table had then, so a composition's
    `roles` and `verify_with_role`, and the other fields added since, stayed empty. A field is
    filled only where it is still empty: what an operator set in admin stays.
    """
    from instances.templates_loader import read_templates

    AgentTemplate = apps.get_model("instances", "AgentTemplate")
    known = {f.name for f in AgentTemplate._meta.get_fields() if getattr(f, "concrete", False)}
    for data in read_templates():
        template = AgentTemplate.objects.filter(name=data["name"]).first()
        if template is None:
            continue  # made whole by the post-migrate hook (`ensure_templates`)
        empty = [
            name for name, value in data.items()
            if name in known and name != "name" and value not in EMPTY and getattr(template, name) in EMPTY
        ]
        for name in empty:
            setattr(template, name, data[name])
        if empty:
            template.save(update_fields=empty)


class Migration(migrations.Migration):

    dependencies = [
        ("instances", "0010_template_objective_cap"),
    ]

    operations = [
        migrations.RunPython(fill, migrations.RunPython.noop),
    ]
