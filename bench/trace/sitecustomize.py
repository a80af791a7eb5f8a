"""Loaded by a corral server started by ``bench/launch_trace.py`` (this folder on its PYTHONPATH):
with CORRAL_PERFTRACE=FILE, wraps the functions on the launch path and writes (start, duration,
thread, name) of every call to FILE on SIGUSR2 and at exit. Functions a checkout lacks are
skipped, so older checkouts can be traced too."""
import os
if os.environ.get("CORRAL_PERFTRACE") and os.environ.get("CORRAL_HOME"):
    import atexit, functools, importlib, threading, time
    _out = []
    _path = os.environ["CORRAL_PERFTRACE"]
    TARGETS = [
        ("corral.api.intake", "Intake", "submit"),
        ("corral.api.intake", "Intake", "_store"),
        ("corral.control.loop", "ControlLoop", "cycle"), ("corral.control.loop", "ControlLoop", "submitted"),
        ("corral.control.loop", "ControlLoop", "_commit"), ("corral.control.loop", "ControlLoop", "_publish_view"),
        ("corral.control.commands", "Commands", "take"), ("corral.control.scheduling", "Scheduling", "run"),
        ("corral.control.launcher", "Launcher", "launch_ready"), ("corral.control.launcher", "Launcher", "launch_for"),
        ("corral.executors.local.executor", "LocalExecutor", "start"), ("corral.node.runner", "NodeRunner", "spawn"),
        ("corral.executors.local.executor", "LocalExecutor", "start_gang"),
        ("corral.node.runner", "NodeRunner", "begin_spawn"), ("corral.node.runner", "Spawning", "result"),
        ("corral.control.discovery", "Discovery", "publish_job"), ("corral.control.discovery", "Discovery", "publish_marked"),
        ("corral.control.effects", "Effects", "run"), ("corral.control.observations", "Observations", "collect"),
        ("corral.executors.local.executor", "LocalExecutor", "_report"),
        ("corral.control.queue", "Queue", "ingest"), ("corral.control.inventory", "Inventory", "refresh"),
        ("corral.control.placement", "Placer", "admit"),
        ("corral.node.proctree", "ProcessTrees", "prepare"), ("corral.node.proctree", "ProcessTrees", "warm"),
        ("corral.node.proctree", "ProcessTrees", "kill"), ("corral.node.proctree", "ProcessTrees", "expect"),
        ("corral.node.namespaces", "NamespaceSpawner", "start"),
        ("corral.admission", "Admission", "check"),
    ]
    def wrap(mod, cls, name):
        try:
            c = getattr(importlib.import_module(mod), cls)
        except Exception:
            return
        f = getattr(c, name, None)
        if f is None:
            return
        label = f"{cls}.{name}"
        @functools.wraps(f)
        def w(*a, **k):
            t0 = time.time()
            try:
                return f(*a, **k)
            finally:
                _out.append((t0, time.time() - t0, threading.current_thread().name, label))
        setattr(c, name, w)
    _done = [False]
    def install():
        for m, c, n in TARGETS:
            wrap(m, c, n)
    def dump():
        import json
        with open(_path, "w") as fh:
            json.dump(_out, fh)
    # install lazily once corral.server is importable
    import builtins
    _orig_import = builtins.__import__
    def _imp(name, *a, **k):
        mod = _orig_import(name, *a, **k)
        if not _done[0] and name == "corral.server" or (not _done[0] and name.startswith("uvicorn")):
            _done[0] = True
            builtins.__import__ = _orig_import
            install()
        return mod
    builtins.__import__ = _imp
    import signal
    def _dump_on_usr2(*_):
        dump()
    signal.signal(signal.SIGUSR2, _dump_on_usr2)
    atexit.register(dump)
