from django.db import migrations


def backfill(apps, schema_editor):
    """Give the shipped templates loaded before `protected_paths` existed the paths their files declare.

    Only a template whose protected paths are still empty is touched (an operator's edit stays).
    """
    from instances.templates_loader import read_templates

    AgentTemplate = apps.get_model("instances", "AgentTemplate")
    for data in read_templates():
        if data.get("protected_paths"):
            AgentTemplate.objects.filter(name=data["name"], protected_paths=[]).update(
                protected_paths=data["protected_paths"]
            )


class Migration(migrations.Migration):

    dependencies = [
        ("instances", "0004_capabilities_protected_paths"),
    ]

    operations = [
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
