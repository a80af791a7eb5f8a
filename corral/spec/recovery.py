"""SkyPilot's ``resources.job_recovery`` (and its old name ``spot_recovery``) in corral's
terms. A managed SkyPilot job is recovered on other machines when it loses its own; corral
always recovers a job that loses a node (the replica restarts, else the job is requeued), so
the strategy needs nothing more. What a
file asks beyond that is recovery from its own failures: ``max_restarts_on_errors: N`` restarts
a replica that exits non-zero up to N times, ``recover_on_exit_codes`` restarts on those codes.
Both become the task's ``restart`` policy, which ``corral status`` shows."""

from __future__ import annotations

from typing import Any, Callable

STRATEGIES = {"FAILOVER", "EAGER_NEXT_REGION"}
_KEYS = {"strategy", "max_restarts_on_errors", "recover_on_exit_codes"}
# recover_on_exit_codes alone has no bound in SkyPilot; a restart loop still needs one here
UNBOUNDED_RESTARTS = 1000


def from_job_recovery(data: dict[str, Any], warn: Callable[[str], None]) -> dict[str, Any]:
    """``data``: a task mapping; returns it with the recovery fields moved out of
    ``resources`` into ``restart``. Raises ValueError naming the field it cannot read."""
    resources = data.get("resources")
    if not isinstance(resources, dict):
        return data
    names = [k for k in ("job_recovery", "spot_recovery") if k in resources]
    if not names:
        return data
    if len(names) == 2:
        raise ValueError("resources takes job_recovery or its old name spot_recovery, not both")
    field = names[0]
    value = resources[field]
    rest = {k: v for k, v in resources.items() if k != field}
    data = {**data, "resources": rest}
    if value is None:
        return data
    if isinstance(value, str):
        value = {"strategy": value}
    if not isinstance(value, dict):
        raise ValueError(f"resources.{field} is a strategy name or a mapping like {{max_restarts_on_errors: 3}}")
    unknown = set(value) - _KEYS
    if unknown:
        raise ValueError(f"resources.{field} has unknown field(s) {', '.join(sorted(map(str, unknown)))}; "
                         f"it takes {', '.join(sorted(_KEYS))}")
    strategy = value.get("strategy")
    if strategy is not None and str(strategy).upper() not in STRATEGIES:
        raise ValueError(f"resources.{field}.strategy {strategy!r} is not one of {', '.join(sorted(STRATEGIES))}")
    errors = value.get("max_restarts_on_errors", 0)
    if isinstance(errors, bool) or not isinstance(errors, int) or errors < 0:
        raise ValueError(f"resources.{field}.max_restarts_on_errors is a whole number >= 0")
    codes = value.get("recover_on_exit_codes")
    if codes is not None:
        codes = [codes] if isinstance(codes, int) and not isinstance(codes, bool) else codes
        if not isinstance(codes, list) or not all(isinstance(c, int) and not isinstance(c, bool) and 0 < c < 256
                                                  for c in codes):
            raise ValueError(f"resources.{field}.recover_on_exit_codes are exit codes 1..255")
    if strategy is not None:
        warn(f"resources.{field}.strategy {strategy}: a job that loses a node is recovered here whatever the "
             "strategy (the replica restarts per its restart policy, else the job is requeued)")
    if not errors and not codes:
        return data
    if data.get("restart") is not None:
        raise ValueError(f"give restart or resources.{field}'s restarts on errors, not both")
    if errors and codes:
        restart = {"policy": "on_failure", "max_restarts": errors}
        warn(f"resources.{field}: restarts on any failure up to {errors} times; recover_on_exit_codes "
             f"({', '.join(map(str, codes))}) count toward that bound here")
    elif errors:
        restart = {"policy": "on_failure", "max_restarts": errors}
        warn(f"resources.{field}: a replica that fails restarts up to {errors} times (restart: on_failure)")
    else:
        restart = {"policy": "on_failure", "max_restarts": UNBOUNDED_RESTARTS, "exit_codes": codes}
        warn(f"resources.{field}: a replica that exits with {', '.join(map(str, codes))} restarts (at most "
             f"{UNBOUNDED_RESTARTS} times); other failures end it")
    return {**data, "restart": restart}
