"""The ``ray`` infra: replicas as detached actors on an existing Ray cluster (``executor``, the
actor in ``actor``); its configuration and registry entry in ``plugin``. Kept empty: every
Ray worker that runs a replica imports this package."""
