"""The ``slurm`` infra: replicas as job steps (``executor``) in Slurm allocations obtained
per job or found around the server (``allocations``, sized by ``shape``), through Slurm's own
commands (``cli``); its configuration and registry entry in ``plugin``."""
