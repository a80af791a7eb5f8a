"""Injected dependencies of the routes: the server's runtime objects, a DB session per
request, the clock and the current user."""

from __future__ import annotations

import functools
import getpass
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi.exceptions import RequestValidationError
from sqlalchemy.orm import Session, sessionmaker

from corral.admission import Admission
from corral.api.intake import Intake
from corral.control.controller import Controller
from corral.pool import NodeSpec
from corral.settings import Settings
from corral.site import Site


@dataclass
class ServerState:
    settings: Settings
    sessions: sessionmaker[Session]
    site: Site
    controller: Controller
    clock: Callable[[], float] = field(default=time.time)
    intake: Intake = field(init=False)
    admission: Admission = field(init=False)

    def __post_init__(self) -> None:
        self.intake = Intake(self.sessions, self.clock, self.controller.submitted)
        self.admission = Admission(self.site)

    @property
    def nodes(self) -> list[NodeSpec]:
        return self.site.nodes


# Trivial dependencies are async so FastAPI does not hop to a worker thread for each one.
async def get_state(request: Request) -> ServerState:
    return request.app.state.corral


async def get_session(state: Annotated[ServerState, Depends(get_state)]) -> AsyncIterator[Session]:
    # Opening a session does no I/O (the connection is taken on first use, in the route's
    # worker thread), so this need not cost a thread hop of its own.
    with state.sessions() as session:
        yield session


async def get_clock(state: Annotated[ServerState, Depends(get_state)]) -> Callable[[], float]:
    return state.clock


@functools.cache
def _server_user() -> str:
    return getpass.getuser()  # reads the environment each call; it does not change while serving


async def get_user(x_corral_user: Annotated[str | None, Header()] = None) -> str:
    # The embedded server listens on loopback only, where the caller is this machine's user.
    user = (x_corral_user or _server_user())[:64]
    if not user.isprintable():
        raise RequestValidationError([{"loc": ["header", "x-corral-user"], "type": "value_error",
                                       "msg": "a user name holds only printable characters"}])
    return user


StateDep = Annotated[ServerState, Depends(get_state)]
SessionDep = Annotated[Session, Depends(get_session)]
ClockDep = Annotated[Callable[[], float], Depends(get_clock)]
UserDep = Annotated[str, Depends(get_user)]
