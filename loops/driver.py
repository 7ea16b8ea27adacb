def on_worker_spawn(sender, proc_name=None, **kwargs):
    pass
