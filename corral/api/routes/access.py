"""Access routes: who am I, the admin's tokens (create, list, revoke) and the audit trail."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response
from starlette.concurrency import run_in_threadpool

from corral.api.deps import IdentityDep, StateDep
from corral.api.errors import documented, invalid_parameter
from corral.api.params import Cursor, TokenId
from corral.api.routes.jobs import moment
from corral.api.schemas import AuditOut, TokenCreated, TokenOut, TokenRequest, WhoAmI, ts
from corral.auth import audit
from corral.auth.roles import ROLE_NAMES, Identity, Role, configured_role
from corral.auth.tokens import TokenRecord
from corral.spec.models import shown
from corral.spec.quantity import parse_duration

router = APIRouter(prefix="/v1", tags=["access"], responses=documented(401, 403))


@router.get("/whoami", response_model=WhoAmI)
def whoami(who: IdentityDep):
    """The caller's user name and role (what the dashboard and `corral whoami` show)."""
    return WhoAmI(user=who.user, role=who.role.value, source=who.source, token=who.token_id)


def _out(record: TokenRecord, state) -> TokenOut:  # noqa: ANN001 - a ServerState
    role = record.role or configured_role(record.user, state.site.operators).value
    return TokenOut(id=record.id, user=record.user, role=role, role_from_config=record.role is None, note=record.note,
                    created_by=record.created_by, created_at=ts(record.created_at), expires_at=ts(record.expires_at),
                    revoked_at=ts(record.revoked_at), last_used_at=ts(record.last_used_at))


def _admin(who: Identity, state, doing: str, action: str | None = None) -> None:  # noqa: ANN001 - a ServerState
    try:
        who.require(doing, Role.admin)
    except HTTPException as exc:
        if action:
            state.auditor.record(who, action, None, "refused", exc.detail)
        raise


@router.post("/tokens", status_code=201, response_model=TokenCreated, responses=documented(400, 413, 422))
def create_token(body: TokenRequest, state: StateDep, who: IdentityDep):
    """A new token for ``user`` (admin only). The answer holds the token itself, this once."""
    _admin(who, state, "creating tokens", "token_create")
    if body.role is not None and body.role not in ROLE_NAMES:
        raise invalid_parameter("body", "role", f"{shown(body.role)} is not a role; roles: {', '.join(ROLE_NAMES)}",
                                "enum")
    expires_at = None
    if body.expires is not None:
        try:
            lifetime = parse_duration(body.expires)
        except ValueError as exc:
            raise invalid_parameter("body", "expires", str(exc)) from None
        if not 0 < lifetime <= 10 * 365 * 86400:
            raise invalid_parameter("body", "expires", "a token lives more than 0 seconds and at most 10 years")
        expires_at = state.clock() + lifetime

    def audited(session, record: TokenRecord) -> None:  # noqa: ANN001 - a Session
        out = _out(record, state)
        state.auditor.add(session, who, "token_create", f"token {record.id}", detail=f"for {record.user} as {out.role}"
                          + (f", expires {out.expires_at:%Y-%m-%d %H:%M} UTC" if out.expires_at else ""))

    record, token = state.tokens.create(body.user, body.role, expires_at, body.note, who.user, audited)
    return TokenCreated(token=token, info=_out(record, state))


@router.get("/tokens", response_model=list[TokenOut])
def list_tokens(state: StateDep, who: IdentityDep, revoked: bool = False):
    """Every token (admin only): id, user, role, dates; never the token. Revoked ones with ``revoked``."""
    _admin(who, state, "listing tokens")
    return [_out(r, state) for r in state.tokens.records(include_revoked=revoked)]


@router.post("/tokens/{token_id}/revoke", response_model=TokenOut, responses=documented(404))
def revoke_token(token_id: TokenId, state: StateDep, who: IdentityDep):
    """Revoke a token (admin only): refused from the next request on."""
    _admin(who, state, "revoking tokens", "token_revoke")
    found = state.tokens.revoke(token_id, lambda session, record: state.auditor.add(
        session, who, "token_revoke", f"token {record.id}", detail=f"of {record.user}"))
    if found is None:
        raise HTTPException(404, f"no token {token_id}")
    record, changed = found
    if not changed:
        state.auditor.record(who, "token_revoke", f"token {record.id}", detail=f"of {record.user}; already revoked")
    return _out(record, state)


@router.get("/audit", response_model=list[AuditOut])
async def audit_trail(state: StateDep, who: IdentityDep, response: Response,
                      since: Annotated[str | None, Query(description="Entries at or after this time (ISO 8601; UTC if no zone)",
                                                         json_schema_extra={"format": "date-time"}, max_length=64)] = None,
                      user: Annotated[str | None, Query(max_length=64)] = None,
                      action: Annotated[str | None, Query(description=f"One of {', '.join(audit.ACTIONS)}")] = None,
                      limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
                      after: Cursor = None):
    """Who did what, when, from where, and whether it was allowed (admin only): the newest
    ``limit`` entries, or with ``after`` the page above that cursor."""
    _admin(who, state, "reading the audit trail")
    if action is not None and action not in audit.ACTIONS:
        raise invalid_parameter("query", "action", f"{shown(action)} is not an audited action; actions: "
                                f"{', '.join(audit.ACTIONS)}", "enum")
    start = moment("since", since)

    def read() -> list[AuditOut]:
        with state.sessions() as session:
            rows = audit.entries(session, since=start, user=user, action=action, limit=limit, after=after)
            return [AuditOut(id=e.id, ts=ts(e.ts), user=e.user, role=e.role, source=e.source, action=e.action,
                             target=e.target, outcome=e.outcome, detail=e.detail) for e in rows]

    rows = await run_in_threadpool(read)
    if len(rows) == limit:
        response.headers["X-Next-After"] = str(rows[-1].id)
    return rows
