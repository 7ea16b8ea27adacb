from django.db import migrations


def load(apps, schema_editor):
    from instances.templates_loader import load_templates

    load_templates(model=apps.get_model("instances", "AgentTemplate"))


class Migration(migrations.Migration):

    dependencies = [
        ("instances", "0002_brains_credentials_templates"),
    ]

    operations = [
        migrations.RunPython(load, migrations.RunPython.noop),
    ]
