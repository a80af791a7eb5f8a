"""control: the imperative shell. Snapshots the store, runs the pure scheduler and the pure
lifecycle rules, applies their decisions with compare-and-swap, and recovers after restarts."""
