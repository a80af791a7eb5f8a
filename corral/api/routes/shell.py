"""``corral exec`` and ``corral shell``: a process started in a running replica's world (its
namespaces or container, working directory, environment and Unix account), driven over a
WebSocket, as ``kubectl exec -it`` and ``srun --overlap --pty`` are.

``/v1/jobs/{job}/shell?replica=task-rank`` (rank 0 of the first task by default), with the
same bearer token as every route. The client's first message says what to start::

    {"command": ["bash"], "tty": true, "rows": 50, "cols": 132, "term": "xterm-256color"}

(``command`` empty: the replica's account's shell). Then the client sends its input as binary
messages, and as text ``{"resize": [rows, cols]}``, ``{"signal": "INT"}`` and ``{"eof": true}``;
the server says ``{"started": {"job": ID, "replica": LABEL}}`` once the process runs, then
sends its output as binary messages whose first byte is 1 (stdout, or the terminal)
or 2 (stderr), and at the end ``{"exit": CODE}``. A refusal is ``{"error": sentence,
"status": HTTP status}`` and the end of the connection.

Allowed to the job's owner and to operators; anyone else is refused (403), and both are
recorded in the audit trail. The process runs as the replica's account, never the server's,
and ends with the connection, with the replica, or when the caller's token is revoked. Each
open one holds one of its user's stream places (``api: {max_streams_per_user}``)."""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import signal
import threading
from collections.abc import Callable
from typing import Annotated, TypeVar

import anyio
from fastapi import APIRouter, HTTPException, WebSocket
from pydantic import BaseModel, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.websockets import WebSocketDisconnect, WebSocketState

from corral.api.deps import ServerState, identify
from corral.auth.roles import Identity
from corral.control.shells import shell_target
from corral.executors.contract import Handle, Shell, ShellError, ShellRequest, Shells
from corral.spec.models import shown
from corral.states import JobState
from corral.store import repository

log = logging.getLogger("corral.shell")
# The caller has left: Starlette's word for it, its word for a send on a closed connection, and
# the ASGI server's (uvicorn raises ``ClientDisconnected``, an ``OSError``, from a send to a
# peer that reset or closed the connection). None of them is a failure of the shell.
_GONE = (WebSocketDisconnect, RuntimeError, OSError)
router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
TOKEN_CHECK_S = 5.0
T = TypeVar("T")
_SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM, "HUP": signal.SIGHUP, "QUIT": signal.SIGQUIT,
            "KILL": signal.SIGKILL, "USR1": signal.SIGUSR1, "USR2": signal.SIGUSR2, "TSTP": signal.SIGTSTP,
            "CONT": signal.SIGCONT, "WINCH": signal.SIGWINCH}


class ShellStart(BaseModel):
    """What to start (the client's first message)."""

    model_config = {"extra": "forbid"}

    command: Annotated[list[Annotated[str, Field(max_length=65536)]], Field(max_length=4096)] = []
    tty: bool = False
    rows: Annotated[int, Field(ge=1, le=10000)] = 24
    cols: Annotated[int, Field(ge=1, le=10000)] = 80
    term: Annotated[str, Field(max_length=64, pattern=r"^[A-Za-z0-9._+-]*$")] = "xterm"


class Refused(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


@router.websocket("/{job}/shell")
async def shell(websocket: WebSocket, job: str, replica: str | None = None):
    state: ServerState = websocket.app.state.corral
    await websocket.accept()
    try:
        who = await _caller(state, websocket)
        start = await _start(websocket)
        target = await _target(state, who, job, replica, start)
    except Refused as exc:
        await _refuse(websocket, exc.status, exc.detail)
        return
    except WebSocketDisconnect:
        return
    label, executor, handle, launch, job_id = target
    what = "a shell" if not start.command else _clipped(shlex.join(start.command))
    env = {**launch.env, **({"TERM": start.term or "xterm"} if start.tty else {})}
    request = ShellRequest(launch.key, launch.job_id, tuple(start.command), env, launch.cwd, launch.run_as,
                           start.tty, start.rows, start.cols)
    try:
        state.streams.take(who)
    except HTTPException as exc:
        await _refuse(websocket, exc.status_code, exc.detail)
        return
    try:
        await run_in_threadpool(state.auditor.record, who, "shell" if start.tty else "exec", f"job {job_id}", "ok",
                                f"{label}: {what}")
        try:
            process = await _opened(executor, handle, request)
        except ShellError as exc:
            await _refuse(websocket, 409, f"replica {label} of job {job_id}: {exc}")
            return
        try:
            try:
                await websocket.send_text(json.dumps({"started": {"job": job_id, "replica": label}}))
            except _GONE:
                return
            await _relay(state, who, websocket, process)
        finally:
            await _ended(process)
        if websocket.client_state == WebSocketState.CONNECTED:
            try:
                await websocket.close(1000)
            except _GONE:
                pass
    finally:
        state.streams.close(who.user)


# The process is ended even when this handler is cancelled rather than returning (uvicorn
# cancels what is still running once its graceful shutdown times out; Starlette's test client
# cancels it as soon as it has said it leaves): ``run_in_threadpool`` checks for a cancellation
# (and waits for a place in its pool) before it starts its thread, so a close awaited through
# it in the ``finally`` of a cancelled handler was never run, and the process outlived its
# connection. Here the thread is started before the first await, and a cancellation only stops
# the waiting for it.

def _in_thread(call: Callable[[], T]) -> asyncio.Future[T]:
    """``call()`` in a thread of its own started now; its outcome, as a future of this loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result, error: BaseException | None) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result)

    def run() -> None:
        try:
            result, error = call(), None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting side
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    threading.Thread(target=run, name="corral-shell", daemon=True).start()
    return future


async def _opened(executor: Shells, handle: Handle, request: ShellRequest) -> Shell:
    """``executor.open_shell``; if this handler is cancelled meanwhile, what it opens is closed."""
    opening = _in_thread(lambda: executor.open_shell(handle, request))
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        def abandoned(future: asyncio.Future) -> None:
            if not future.cancelled() and future.exception() is None:
                _in_thread(future.result().close)

        opening.add_done_callback(abandoned)
        raise


async def _ended(process: Shell) -> None:
    """``process.close()``, started now and awaited (shielded from the anyio scope the handler
    runs in, so that a test client or server cancelling it waits for the process's end)."""
    closing = _in_thread(process.close)
    with anyio.CancelScope(shield=True):
        await asyncio.shield(closing)


def _clipped(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


async def _caller(state: ServerState, websocket: WebSocket) -> Identity:
    scheme, _, token = (websocket.headers.get("authorization") or "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Refused(401, "not authenticated: send Authorization: Bearer TOKEN")
    try:
        return await identify(state, token, websocket)
    except HTTPException as exc:
        raise Refused(exc.status_code, str(exc.detail)) from None


async def _start(websocket: WebSocket) -> ShellStart:
    text = await websocket.receive_text()
    try:
        return ShellStart.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "message"
        raise Refused(422, f"the first message is not a valid start: {field}: {first['msg']}") from None


async def _target(state: ServerState, who: Identity, ident: str, replica: str | None, start: ShellStart):
    action = "shell" if start.tty else "exec"
    if "\x00" in ident or "\x00" in (replica or ""):  # (the HTTP guard's rule: no name or id holds one)
        raise Refused(422, "the job and replica must not hold a NUL byte")

    def lookup():
        with state.sessions() as session:
            found = repository.find_job(session, ident, who.user)
            if found is None:
                raise Refused(404, f"no job {shown(ident)}")
            return (found.id, found.user, found.state, [t.name for t in found.tasks],
                    [r.label for r in found.replicas])

    job_id, owner, job_state, tasks, labels = await run_in_threadpool(lookup)
    try:
        who.require_on(owner, f"{action} into a job's replica",
                       f"{action} into another user's job (job {job_id}, {owner}'s)")
    except HTTPException as exc:
        await run_in_threadpool(state.auditor.record, who, action, f"job {job_id}", "refused", exc.detail)
        raise Refused(exc.status_code, str(exc.detail)) from None
    if job_state != JobState.RUNNING.value:
        raise Refused(409, f"job {job_id} is {job_state}; a process can be started only in a running job's replicas")
    label = replica if replica is not None else f"{tasks[0]}-0"
    if label not in labels:
        raise Refused(404, f"job {job_id} has no replica {shown(label)}; it has {', '.join(labels)}")
    found = await run_in_threadpool(state.read, lambda: shell_target(state.loop, job_id, label))
    if found.refused:
        raise Refused(found.status, found.refused)
    if not isinstance(found.executor, Shells):
        raise Refused(501, f"replica {label} of job {job_id} runs on infra {found.executor.name}, which cannot "
                           "start a process beside its replicas")
    return label, found.executor, found.handle, found.launch, job_id


async def _refuse(websocket: WebSocket, status: int, detail: str) -> None:
    if websocket.client_state == WebSocketState.CONNECTED:
        try:
            await websocket.send_text(json.dumps({"error": detail, "status": status}))
            await websocket.close(1008 if status in (401, 403) else 1011 if status >= 500 else 1000)
        except _GONE:
            pass


async def _relay(state: ServerState, who: Identity, websocket: WebSocket, process: Shell) -> None:
    """Output out, input and controls in, until the process's output ends (then its exit code
    goes out) or the caller leaves, or its token is revoked (then the caller ends the process)."""

    async def output() -> None:
        while True:
            kind, data = await run_in_threadpool(process.read)
            if kind == 0:
                break
            await websocket.send_bytes(bytes([kind]) + data)
        code = await run_in_threadpool(process.wait)
        await websocket.send_text(json.dumps({"exit": code}))

    async def inputs() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("bytes") is not None:
                await run_in_threadpool(process.write, message["bytes"])
            elif message.get("text") is not None:
                await _control(process, message["text"])

    async def token() -> None:
        while state.tokens.live(who.token_id):
            await asyncio.sleep(TOKEN_CHECK_S)
        await _refuse(websocket, 401, "the token this connection was opened with was revoked or expired")

    tasks = [asyncio.create_task(output()), asyncio.create_task(inputs()), asyncio.create_task(token())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
            # its end taken when it comes, so one that fails while being cancelled (a send meeting
            # the closed connection) is not reported as an exception nobody retrieved; not awaited
            # here: a read in a thread ends only once the process is ended, after this returns
            task.add_done_callback(_taken)


def _taken(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None and not isinstance(task.exception(), _GONE):
        log.warning("shell relay failed: %r", task.exception())


async def _control(process: Shell, text: str) -> None:
    try:
        control = json.loads(text)
    except ValueError:
        return
    if not isinstance(control, dict):
        return
    if isinstance(control.get("resize"), list) and len(control["resize"]) == 2:
        rows, cols = control["resize"]
        if isinstance(rows, int) and isinstance(cols, int) and 0 < rows <= 10000 and 0 < cols <= 10000:
            await run_in_threadpool(process.resize, rows, cols)
    elif control.get("signal") in _SIGNALS:
        await run_in_threadpool(process.signal, _SIGNALS[control["signal"]])
    elif control.get("eof") is True:
        await run_in_threadpool(process.close_input)
