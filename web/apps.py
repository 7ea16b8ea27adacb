from django.apps import AppConfig


class WebConfig(AppConfig):
    """The surfaces: the console, the REST API, the websockets, MCP, sign-in and tokens, ops, the CLI."""

    name = "web"

    def ready(self) -> None:
        from web import receivers  # lazy: it imports the models, which load after the app registry

        receivers.connect()
