"""The console: server-rendered pages over loops.selectors and loops.services (see views.py)."""
