"""The audit trail is written with the change it records: a submission, cancel, hold,
release, requeue, scale, priority change, token creation or revocation and its entry commit in
one transaction, so a failed commit stores neither and a successful one both (and an entry is
there as soon as the request is answered, with no writer of its own to wait for or lose on
a crash). On SQLite and PostgreSQL, with a commit made to fail at the database driver."""

from __future__ import annotations

import pytest
from sqlalchemy import event, select

from conftest import bearer, submit, wait_for, wait_state

from corral.store.tables import ApiToken, AuditEntry, Job

ON_POSTGRESQL = True  # what the store keeps: checked on PostgreSQL too (conftest)


class CommitRefused(Exception):
    pass


class FailingCommits:
    """While ``armed``, the commit of any transaction that inserted an audit entry fails (as a
    lost connection or a full disk would): the test needs the transaction that carries an entry
    to fail, whichever thread (route, intake) runs it."""

    def __init__(self, sessions, engine):
        self.armed = False
        self.refused = 0
        event.listen(engine, "before_cursor_execute", self._noted)
        event.listen(engine, "commit", self._forget)
        event.listen(engine, "rollback", self._forget)
        event.listen(sessions, "before_commit", self._commit)

    def _noted(self, conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
        if statement.lstrip().upper().startswith("INSERT INTO AUDIT"):
            conn.info["audited"] = True

    def _commit(self, session) -> None:  # noqa: ANN001
        if self.armed and session.in_transaction() and session.connection().info.get("audited"):
            self.refused += 1
            raise CommitRefused("commit refused by the test")

    def _forget(self, conn) -> None:  # noqa: ANN001
        conn.info.pop("audited", None)


@pytest.fixture
def failing(server) -> FailingCommits:
    return FailingCommits(server.state.sessions, server.state.sessions.kw["bind"])


def _stored(server, *ids: int) -> tuple[list[tuple], list[tuple]]:
    """(id, hold, nice, cancel requested, desired replicas) of the jobs ``ids`` (every job's id
    when none is named), and (user, action, target, outcome) of every audit entry, as the store
    has them."""
    with server.state.sessions() as session:
        query = select(Job).order_by(Job.id)
        jobs = [(j.id, j.hold, j.nice, j.cancel_requested_at is not None, [t.num_nodes for t in j.tasks])
                for j in session.scalars(query.where(Job.id.in_(ids)) if ids else query)]
        entries = [(e.user, e.action, e.target, e.outcome) for e in session.scalars(select(AuditEntry).order_by(AuditEntry.id))]
    return jobs, entries


def _refused(failing: FailingCommits, call) -> None:
    """``call`` fails on its commit (the server answers 500, which the test client raises)."""
    before = failing.refused
    failing.armed = True
    try:
        with pytest.raises(CommitRefused):
            call()
    finally:
        failing.armed = False
    assert failing.refused > before


def _retried(failing: FailingCommits, call, stored) -> object:
    """A change the control loop carries out: its commit fails (nothing stored, the caller
    still waits), the loop carries it out again and the caller gets the one outcome."""
    import threading

    before = stored()
    answer: list = []
    failing.refused = 0
    failing.armed = True
    caller = threading.Thread(target=lambda: answer.append(call()))
    try:
        caller.start()
        wait_for(lambda: failing.refused >= 1, timeout=20)
        assert stored() == before  # the failed commit stored neither the change nor its entry
        assert caller.is_alive()  # and the caller was not told it was done
    finally:
        failing.armed = False
    caller.join(timeout=30)
    assert answer, "the change was never carried out"
    return answer[0]


def test_a_failed_commit_stores_neither_the_change_nor_its_entry_a_successful_one_both(server, failing) -> None:
    admin = {"Authorization": f"Bearer {server.state.local_token}"}
    olga = bearer(server.state, "olga", "operator")

    # a submission: stored by the intake in a batch, its entries in the batch's transaction
    _refused(failing, lambda: server.post("/v1/jobs", json={"yaml": "name: lost\nrun: sleep 60\n"}))
    assert _stored(server) == ([], [])
    vip = server.post("/v1/jobs", json={"yaml": "name: vip\nrun: sleep 60\n", "scheduling": {"priority": 7}},
                      headers=olga).json()["job"]
    # pending for as long as the test needs (released, it still waits for vip)
    held = submit(server, "name: held\nrun: sleep 60\n",
                  scheduling={"hold": True, "nice": 5, "dependency": f"afterok:{vip['id']}"})
    jobs, entries = _stored(server)
    assert [j[0] for j in jobs] == [vip["id"], held["id"]]
    assert entries == [("olga", "submit", f"job {vip['id']}", "ok"), ("olga", "priority", f"job {vip['id']}", "ok"),
                       ("alice", "submit", f"job {held['id']}", "ok")]

    # each change of a job: refused at its commit, then done; the entry goes with the change
    target = f"job {held['id']}"
    steps = [
        (lambda: server.post(f"/v1/jobs/{held['id']}/release"), ("alice", "release", target, "ok"),
         lambda job: job[1] == ""),
        (lambda: server.post(f"/v1/jobs/{held['id']}/hold"), ("alice", "hold", target, "ok"),
         lambda job: job[1] == "user"),
        (lambda: server.post(f"/v1/jobs/{held['id']}/priority", json={"nice": 9}), ("alice", "priority", target, "ok"),
         lambda job: job[2] == 9),
        (lambda: server.post(f"/v1/jobs/{held['id']}/cancel"), ("alice", "cancel", target, "ok"),
         lambda job: job[3]),
    ]
    for call, entry, changed in steps:  # carried out by the control loop, in its transaction
        before = _stored(server, held["id"])
        assert _retried(failing, call, lambda: _stored(server, held["id"])).status_code == 200, entry
        (job,), entries = _stored(server, held["id"])
        assert entries == before[1] + [entry] and changed(job), entry  # once, with its entry

    # requeue and scale act on a running job
    elastic = submit(server, "name: el\nnum_nodes: {min: 1, max: 2, initial: 1}\nrun: sleep 60\n")
    wait_state(server, elastic["id"], "RUNNING")
    # (the scale is read before the requeue: a requeued elastic task comes back at its initial
    # size once its replicas have stopped, which under load came before a read after both)
    for call, entry, changed in ((lambda: server.post(f"/v1/jobs/{elastic['id']}/scale", json={"task": "el", "replicas": 2}),
                                  ("alice", "scale", f"job {elastic['id']}", "ok"), lambda job: job[4] == [2]),
                                 (lambda: server.post(f"/v1/jobs/{elastic['id']}/requeue"),
                                  ("alice", "requeue", f"job {elastic['id']}", "ok"), lambda job: True)):
        before = _stored(server, elastic["id"])
        assert _retried(failing, call, lambda: _stored(server, elastic["id"])).status_code == 200, entry
        (job,), entries = _stored(server, elastic["id"])
        assert entries == before[1] + [entry] and changed(job), (entry, job)
    causes = [e["cause"] for e in server.get(f"/v1/jobs/{elastic['id']}/events").json()]
    assert causes.count("requeue_requested") == 1 and causes.count("scale_requested") == 1

    # tokens: the token and its entry, or neither
    def tokens() -> list[tuple]:
        with server.state.sessions() as session:
            return [(t.user, t.revoked_at is not None) for t in session.scalars(select(ApiToken).order_by(ApiToken.id))]

    before, known = _stored(server)[1], tokens()
    _refused(failing, lambda: server.post("/v1/tokens", json={"user": "tim"}, headers=admin))
    assert (_stored(server)[1], tokens()) == (before, known)
    made = server.post("/v1/tokens", json={"user": "tim"}, headers=admin).json()["info"]
    assert tokens() == known + [("tim", False)]
    assert _stored(server)[1][-1] == (server.state.owner, "token_create", f"token {made['id']}", "ok")
    before = _stored(server)[1]
    _refused(failing, lambda: server.post(f"/v1/tokens/{made['id']}/revoke", headers=admin))
    assert _stored(server)[1] == before and tokens()[-1] == ("tim", False)
    assert server.post(f"/v1/tokens/{made['id']}/revoke", headers=admin).status_code == 200
    assert tokens()[-1] == ("tim", True)
    assert _stored(server)[1][-1] == (server.state.owner, "token_revoke", f"token {made['id']}", "ok")
    # the audit route reads what the store holds, nothing waits in a queue
    trail = server.get("/v1/audit", headers=admin).json()
    assert [(e["user"], e["action"], e["target"], e["outcome"]) for e in trail] == _stored(server)[1]
    for job in (vip, elastic):
        server.post(f"/v1/jobs/{job['id']}/cancel")


def test_a_refusal_whose_entry_cannot_be_written_is_still_the_refusal(server, monkeypatch, caplog) -> None:
    """A refusal changes nothing, so a database that cannot take its entry (a refused
    connection under load) does not turn the 403 into a 500; the lost entry is logged."""
    from sqlalchemy.exc import OperationalError

    olga = bearer(server.state, "olga", "operator")
    ann = bearer(server.state, "ann", "user")
    job = server.post("/v1/jobs", json={"yaml": "name: olgas\nrun: sleep 60\n"}, headers=olga).json()["job"]

    def no_connection():
        raise OperationalError("connect", {}, Exception("sorry, too many clients already"))

    monkeypatch.setattr(server.state.auditor, "sessions", no_connection)
    answer = server.post(f"/v1/jobs/{job['id']}/cancel", headers=ann)
    assert answer.status_code == 403, answer.text
    assert "cancelling another user's job" in answer.json()["detail"]
    assert "could not be written" in caplog.text and "ann's refused cancel" in caplog.text
    monkeypatch.undo()
    assert server.post(f"/v1/jobs/{job['id']}/cancel", headers=olga).status_code == 200
