"""The executor conformance suite: one set of contract tests, run against every registered
infra through a real corral server (docs/executors.md)."""
