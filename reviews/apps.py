from django.apps import AppConfig


class ReviewsConfig(AppConfig):
    name = "reviews"
    verbose_name = "Reviews, receipts and audit"

    def ready(self) -> None:
        from reviews import receivers  # lazy: it imports the models, which load after the app registry

        receivers.connect()
