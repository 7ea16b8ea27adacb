from django.apps import AppConfig


class ReviewsConfig(AppConfig):
    name = "reviews"
    verbose_name = "Reviews, receipts and audit"

    def ready(self) -> None:
        from budgets.signals import threshold_crossed
        from reviews import notify

        # A pool crossing its soft threshold is one of the things people are told about.
        threshold_crossed.connect(notify.on_threshold_crossed, dispatch_uid="reviews.threshold_crossed")
