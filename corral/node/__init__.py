"""node: the code that runs on a node beside replicas, whatever infra brought it there: the
wrapper that starts an attempt in its own session, cgroup and namespaces and records that it
started and how it ended (``runner``), the process trees ended whole (``proctree``), the
fresh namespaces of an attempt (``namespaces``), the name resolver replicas load
(``resolver``), and the ``srun``/``scontrol`` of batch scripts off Slurm (``srun``). Imports
nothing of the server: a Ray actor's worker loads it."""
