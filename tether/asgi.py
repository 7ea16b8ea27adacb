"""HTTP and websocket routing for daphne (HTTP `/mcp` goes to the MCP server, see web.mcp_http)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tether.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi = get_asgi_application()

from tether import dbpool  # noqa: E402

dbpool.enable_web()  # before anything connects: this process's connections come from one bounded pool

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from tether.origin import SameOriginValidator  # noqa: E402
from tether.routing import websocket_urlpatterns  # noqa: E402
from web.consumers import HerdAuthMiddlewareStack  # noqa: E402
from web.mcp_http import McpMount  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": McpMount(django_asgi),  # /mcp: the MCP server; everything else: Django
        "websocket": SameOriginValidator(HerdAuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
