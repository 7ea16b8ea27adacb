from django.apps import AppConfig


class TriggersConfig(AppConfig):
    name = "triggers"

    def ready(self) -> None:
        from triggers import receivers  # lazy: it imports the models, which load after the app registry

        receivers.connect(self)
