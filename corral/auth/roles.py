"""The four roles and the rules between them. A caller is an ``Identity``: a user name, a
role and where the request came from. Refusals are ``Forbidden`` with one sentence naming
the role an action needs and the caller's own, so a person knows whom to ask.

    admin     everything: tokens, the audit trail, any job
    operator  any job: cancel, hold, release, requeue, scale, priority and negative nice
    user      submit; their own jobs; read the queue, nodes and GPU map, fair share, priority, usage
    viewer    read only: what a user may read, nothing they may change

The server's owner, through the local token, is admin. A token made without ``--role`` follows
config.yaml: the ``operators:`` are operators, everyone else a user."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from fastapi import HTTPException


class Role(str, Enum):
    viewer = "viewer"
    user = "user"
    operator = "operator"
    admin = "admin"

    @property
    def rank(self) -> int:
        return _RANKS[self]

    def at_least(self, other: Role) -> bool:
        return self.rank >= other.rank

    @property
    def article(self) -> str:
        return "an" if self in (Role.admin, Role.operator) else "a"


_RANKS = {Role.viewer: 0, Role.user: 1, Role.operator: 2, Role.admin: 3}
ROLE_NAMES = tuple(r.value for r in Role)


def configured_role(user: str, operators: tuple[str, ...]) -> Role:
    """The role config.yaml gives a user whose token names none."""
    return Role.operator if user in operators else Role.user


@dataclass(frozen=True)
class Identity:
    user: str
    role: Role
    source: str  # "local" (the owner's local token) or the client's address
    token_id: int | None = None

    def refuse(self, doing: str, needs: Role) -> HTTPException:
        """A 403 saying that ``doing`` needs role ``needs``."""
        return HTTPException(403, f"{doing} needs the {needs.value} role (you are {self.user}, "
                                  f"{self.role.article} {self.role.value})")

    def require(self, doing: str, needs: Role) -> None:
        if not self.role.at_least(needs):
            raise self.refuse(doing, needs)

    def may_see_inside(self, owner: str) -> bool:
        """Whether this caller may read a job's logs, environment and event details: its owner
        (with a role that acts on jobs) or an operator."""
        return self.role.at_least(Role.operator) or (owner == self.user and self.role.at_least(Role.user))

    def require_inside(self, owner: str, what: str) -> None:
        """Allow reading ``what`` (logs, environment) of a job of ``owner``."""
        if self.may_see_inside(owner):
            return
        if owner == self.user:
            raise self.refuse(f"reading a job's {what}", Role.user)
        raise self.refuse(f"reading another user's {what}", Role.operator)

    def require_on(self, owner: str, doing: str, others: str) -> None:
        """Allow ``doing`` on a job of ``owner``: a user on their own, an operator on any.
        ``others`` is the phrase for someone else's job (``cancelling another user's job``)."""
        if owner == self.user:
            self.require(doing, Role.user)
        else:
            self.require(others, Role.operator)
