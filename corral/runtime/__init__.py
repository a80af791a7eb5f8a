"""runtime: what a replica sees and what users read of it — its environment (names, ranks,
GPUs, SkyPilot/Slurm variables) and its logs."""
