"""control: the imperative shell around the pure core. The control loop (``loop``) runs one
coalesced cycle at a time: take commands, apply what executors observed, decide (the pure
scheduler, supervisor and job-group rules), journal, then execute; each concern is a
component of its own (queue, scheduling, placement, launcher, carrier, requeue, scaling,
pipeline, provisioning, probes, discovery, endpoints, recovery). The rest of the server
reads the loop's published view (``view``), never its memory."""
