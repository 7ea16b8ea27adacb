"""Where people reach this server: the address a sign-in link names, and whether Django accepts it.

`HOST=0.0.0.0` (or `::`) listens on every interface, but `http://0.0.0.0:8000/` opens nothing
on a phone. `reachable_host` names this machine's LAN address instead: the one the kernel
would send from towards a private network (a UDP socket "connected" there; nothing is sent),
else its host name. `allowed` says whether a request naming that host passes Django's
ALLOWED_HOSTS (TETHER_ALLOWED_HOSTS) check, and `hint` what to set when it would not.
Reads the network configuration; sends nothing.
"""

from __future__ import annotations

import ipaddress
import socket

from django.conf import settings
from django.http.request import validate_host

WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})
# Private addresses nothing needs to answer: connecting a UDP socket only picks a route.
_PROBES = ((socket.AF_INET, "10.254.254.254"), (socket.AF_INET6, "fd00:7e7e::1"))


def listens_everywhere(bind_host: str) -> bool:
    """Return True when `bind_host` is a wildcard (every interface), not an address to visit."""
    return bind_host.strip() in WILDCARDS


def lan_address() -> str | None:
    """Return this machine's address on its local network, or None when it has no route to one."""
    for family, probe in _PROBES:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.connect((probe, 9))
                address = sock.getsockname()[0]
        except OSError:
            continue
        if not ipaddress.ip_address(address.split("%")[0]).is_loopback:
            return str(address)
    return None


def reachable_host(bind_host: str) -> str:
    """Return the host other devices use to reach a server listening on `bind_host`, as a URL writes it."""
    host = bind_host.strip()
    if listens_everywhere(host):
        host = lan_address() or socket.gethostname() or "127.0.0.1"
    host = host.strip("[]")
    try:
        if ipaddress.ip_address(host.split("%")[0]).version == 6:
            return f"[{host}]"
    except ValueError:
        pass
    return host


def base_url(bind_host: str, port: int | str) -> str:
    """Return the http URL of a server listening on `bind_host`:`port`, never naming a wildcard."""
    return f"http://{reachable_host(bind_host)}:{port}"


def allowed(host: str) -> bool:
    """Return True when Django answers requests whose Host is `host` (a URL's host, no port)."""
    return validate_host(host.lower(), settings.ALLOWED_HOSTS)


def hint(host: str) -> str:
    """Return what to set so that requests naming `host` are answered; "" when they already are."""
    if allowed(host):
        return ""
    hosts = [h for h in settings.ALLOWED_HOSTS if h != "testserver"]
    return (
        f"{host} is not in TETHER_ALLOWED_HOSTS, so requests to it get 400 Bad Request. "
        f"Start Tether with TETHER_ALLOWED_HOSTS={','.join([*hosts, host])}"
    )
