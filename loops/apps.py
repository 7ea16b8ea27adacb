from django.apps import AppConfig


class LoopsConfig(AppConfig):
    name = "loops"

    def ready(self) -> None:
        from django_q.signals import post_spawn

        from loops import driver

        # Every django-q2 worker process hosts one driver: a pool of threads that
        # drive claimed runs, a heartbeat that renews their leases and watches for
        # stop requests, and the reaper.
        post_spawn.connect(driver.on_worker_spawn, dispatch_uid="tether-driver")
