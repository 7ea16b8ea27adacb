from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("instances", "0005_backfill_template_protected_paths"),
    ]

    operations = [
        migrations.AddField(
            model_name="instance",
            name="archived_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
