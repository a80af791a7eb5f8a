"""sim: replays job traces through the same pure scheduler over a fake clock, to compare
policies (fifo, slurm, corral) and to measure the scheduler's speed."""
