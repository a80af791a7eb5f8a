"""A bounded schemathesis run against the server's own ``/openapi.json``: every operation with
generated valid and invalid requests (Unicode, huge numbers, NUL bytes …), over real HTTP to a
real server, on SQLite and PostgreSQL. No response may be a 5xx, and every status, content
type and body must be the one the document promises."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import GenerationMode, checks  # noqa: E402

from conftest import POOL, kill_leftovers  # noqa: E402

ON_POSTGRESQL = True  # what the store keeps: checked on PostgreSQL too (conftest)

CHECKS = [checks.not_a_server_error, checks.status_code_conformance, checks.content_type_conformance,
          checks.response_schema_conformance, checks.response_headers_conformance, checks.negative_data_rejection]


AUTH: dict[str, str] = {}  # the running server's local token: every route but health needs one


@schemathesis.auth(refresh_interval=None, retry_on=[])
class LocalToken:
    """Sends the server owner's local token, except in the cases schemathesis generates
    without it on purpose (those must be refused with a documented 401)."""

    def get(self, case, context) -> str:  # noqa: ANN001 - schemathesis types
        return AUTH["token"]

    def set(self, case, data: str, context) -> None:  # noqa: ANN001
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@pytest.fixture
def api_schema(corral_home: Path, db_url: str):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env |= {"CORRAL_HOME": str(corral_home), "CORRAL_DB_URL": db_url}
    (corral_home / "config.yaml").write_text(POOL)
    cli = [sys.executable, "-m", "corral.cli.main"]
    subprocess.run(cli + ["server", "start"], env=env, check=True, capture_output=True, timeout=120)
    url = json.loads((corral_home / "server.json").read_text())["url"]
    AUTH["token"] = (corral_home / "local.token").read_text().strip()
    try:
        # the document needs a token like every route but health
        yield schemathesis.openapi.from_url(url + "/openapi.json", headers={"Authorization": f"Bearer {AUTH['token']}"})
    finally:
        subprocess.run(cli + ["server", "stop"], env=env, capture_output=True, timeout=120)
        log = corral_home / "server.log"
        kill_leftovers(corral_home)
        if log.exists():  # a 5xx leaves its traceback here; show it with the failure
            tail = log.read_text(errors="replace")[-4000:]
            if "Traceback" in tail:
                print(tail)


def test_every_operation_answers_as_documented(api_schema) -> None:
    """Each operation in turn, with valid and then invalid requests. The cases are drawn
    through schemathesis's public strategies rather than its pytest plugin (whose lazy
    fixture schemas reach into pytest internals that pytest 9.2 removed)."""
    problems: list[str] = []
    for result in api_schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                strategy = operation.as_strategy(generation_mode=mode)
            except Exception as exc:  # nothing negative to make of an operation without inputs
                if mode == GenerationMode.NEGATIVE:
                    continue
                raise AssertionError(f"{operation.label}: no cases ({exc})") from exc

            @given(case=strategy)
            @settings(max_examples=50, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            def check(case) -> None:  # noqa: ANN001 - a schemathesis Case
                if case.path.endswith("/logs"):  # a followed log waits for its job's end
                    case.query = {**(case.query or {}), "follow": "false"}
                case.call_and_validate(checks=CHECKS, timeout=30)

            try:
                check()
            except Unsatisfiable:  # no invalid request exists for an operation without inputs
                if mode != GenerationMode.NEGATIVE:
                    problems.append(f"{operation.label}: no valid request could be made")
            except (Exception, BaseExceptionGroup) as exc:  # every operation gets its turn; all are shown
                problems.append(f"{operation.label} ({mode.value}): {str(exc)[:1500]}")
    assert not problems, "\n\n".join(problems)
