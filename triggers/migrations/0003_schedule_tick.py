"""The tick of schedules: one django-q2 Schedule that calls `triggers.tasks.tick` every minute."""

from django.db import migrations
from django.utils import timezone

TICK = "tether.schedules.tick"


def add_tick(apps, schema_editor):
    Schedule = apps.get_model("django_q", "Schedule")
    Schedule.objects.get_or_create(
        name=TICK,
        defaults={
            "func": "triggers.tasks.tick",
            "schedule_type": "I",  # MINUTES
            "minutes": 1,
            "repeats": -1,
            "next_run": timezone.now(),
        },
    )


def remove_tick(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name=TICK).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("triggers", "0002_schedules_and_firings"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(add_tick, remove_tick)]
