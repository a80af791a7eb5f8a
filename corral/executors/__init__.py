"""executors: thin adapters that start, signal, watch and adopt replicas. ``local`` runs
processes on this machine (the embedded default); engines beyond one machine (Ray, a Slurm
allocation, Kubernetes) plug in behind the same protocol."""
