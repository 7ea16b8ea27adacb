"""The one django-q2 schedule of the review watch and the digests (`reviews.tasks.watch_and_digest`, every 5 minutes)."""

from django.db import migrations

NAME = "tether-review-watch"


def add(apps, schema_editor):
    Schedule = apps.get_model("django_q", "Schedule")
    Schedule.objects.update_or_create(
        name=NAME,
        defaults={
            "func": "reviews.tasks.watch_and_digest",
            "schedule_type": "I",
            "minutes": 5,
            "repeats": -1,
        },
    )


def remove(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name=NAME).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("reviews", "0006_review_watch_and_digests"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(add, remove)]
