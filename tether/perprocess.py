"""One of a thing per process: made on first use, and made again in a process forked after that.

A driver, a doorbell's event loop and the act gateway's MCP bridge each run threads, and a forked
child inherits the object but none of its threads: the child makes its own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable


class PerProcess[T]:
    """Hold this process's one `make()`; `get` returns it, making it first in a new process."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._made: tuple[int, T] | None = None  # (the process that made it, it)
        self._lock = threading.Lock()

    def get(self) -> T:
        with self._lock:
            if self._made is None or self._made[0] != os.getpid():
                self._made = (os.getpid(), self._make())
            return self._made[1]
