"""`python manage.py notify_deliver [--wait]` — attempt the notifications that are due.

The worker queue normally sends them; this sweep catches any that could not be queued
(and, with --wait, sends everything pending now, sleeping out the backoff between attempts).
"""

from django.core.management.base import BaseCommand

from reviews import notify
from reviews.models import Delivery


class Command(BaseCommand):
    help = "Attempt pending notification deliveries that are due."

    def add_arguments(self, parser):
        parser.add_argument("--wait", action="store_true", help="retry each pending delivery until it ends")

    def handle(self, *args, wait=False, **options):
        if wait:
            pending = list(Delivery.objects.filter(status=Delivery.Status.PENDING).values_list("pk", flat=True))
            for delivery_id in pending:
                notify.deliver_now(delivery_id)
            self.stdout.write(f"{len(pending)} pending deliveries attempted until they ended")
            return
        count = notify.deliver_due()
        self.stdout.write(f"{count} due deliveries attempted")
