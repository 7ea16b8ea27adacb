from django.apps import AppConfig


class LoopsConfig(AppConfig):
    name = "loops"

    def ready(self) -> None:
        from loops import receivers  # lazy: it imports the models (and django_q's), loaded after apps.py

        receivers.connect()
