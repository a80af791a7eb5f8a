"""The ``local`` infra: replicas as processes on the server's machine (``executor``); its
configuration and registry entry in ``plugin``."""
