"""``corral exec JOB [REPLICA --] CMD…`` and ``corral shell JOB [REPLICA]``: a process in a
running replica's world, as ``kubectl exec`` and ``srun --overlap --pty`` give.

``shell`` (and ``exec -t``) puts this terminal in raw mode, so every key (Ctrl-C, Ctrl-Z,
arrows) goes to the remote terminal as typed; the remote terminal follows this one's size
(SIGWINCH); this terminal is restored however the command ends. ``exec`` without a terminal
keeps stdout and stderr apart, passes piped stdin on (a terminal's only with ``-i``), sends
Ctrl-C and SIGTERM on as signals, and exits with the process's exit code."""

from __future__ import annotations

import os
import signal
import sys
import threading
from argparse import Namespace

from corral import embedded as daemon
from corral.cli.render import Usage, fail
from corral.client import CorralError, ShellSession


def shell(args: Namespace) -> None:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise Usage("JOB", "corral shell needs a terminal on stdin and stdout; for a command without one, "
                           "use `corral exec JOB -- COMMAND`")
    _run(args.job, args.replica, [], tty=True, forward_stdin=True)


def exec_(args: Namespace) -> None:
    words = list(args.rest)
    replica, tty, forward = None, args.tty, args.stdin
    if "--" in words:
        at = words.index("--")
        before, command = words[:at], words[at + 1:]
        for word in before:
            if word in ("-t", "--tty"):
                tty = True
            elif word in ("-i", "--stdin"):
                forward = True
            elif replica is None and not word.startswith("-"):
                replica = word
            else:
                raise Usage(word, "before --, give at most REPLICA (e.g. trainer-1) and -t/-i")
    else:
        command = words
    if not command:
        raise Usage("COMMAND", "give the command to run: corral exec JOB [REPLICA --] COMMAND [ARG…]")
    if tty and not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise Usage("-t", "a terminal (-t) needs one on stdin and stdout here")
    _run(args.job, replica, command, tty=tty, forward_stdin=tty or forward or not sys.stdin.isatty())


def _run(job: str, replica: str | None, command: list[str], tty: bool, forward_stdin: bool) -> None:
    client = daemon.client()
    rows, cols = _size() if tty else (24, 80)
    try:
        session = client.shell(job, command, replica, tty=tty, rows=rows, cols=cols,
                               term=os.environ.get("TERM") or "xterm")
    except CorralError as exc:
        fail(exc)
        return
    code = 1
    try:
        code = _terminal(session) if tty else _pipes(session, forward_stdin)
    except CorralError as exc:
        fail(exc)
    finally:
        session.close()
    sys.exit(code)


def _size() -> tuple[int, int]:
    try:
        size = os.get_terminal_size(sys.stdout.fileno())
    except OSError:
        return 24, 80
    # a terminal that reports no size (script(1), some CI consoles) gets the classic one
    return size.lines or 24, size.columns or 80


def _feed(session: ShellSession, eof: bool) -> None:
    """This side's stdin on to the process, until it ends here (then, ``eof``, its end)."""
    while True:
        try:
            data = os.read(sys.stdin.fileno(), 65536)
        except OSError:
            data = b""
        if not data:
            if eof:
                session.eof()
            return
        session.send(data)


def _receive(session: ShellSession) -> int:
    out, err = sys.stdout.buffer, sys.stderr.buffer
    while True:
        kind, data = session.receive()
        if kind == "exit":
            return int(data)
        stream = out if kind == 1 else err
        stream.write(data)
        stream.flush()


def _terminal(session: ShellSession) -> int:
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    previous = signal.signal(signal.SIGWINCH, lambda *_: session.resize(*_size()))
    try:
        tty.setraw(fd)
        threading.Thread(target=_feed, args=(session, False), daemon=True, name="corral-stdin").start()
        return _receive(session)
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, previous)


def _pipes(session: ShellSession, forward_stdin: bool) -> int:
    if forward_stdin:
        threading.Thread(target=_feed, args=(session, True), daemon=True, name="corral-stdin").start()
    else:
        session.eof()
    signal.signal(signal.SIGINT, lambda *_: session.signal("INT"))
    signal.signal(signal.SIGTERM, lambda *_: session.signal("TERM"))
    signal.signal(signal.SIGHUP, lambda *_: session.signal("HUP"))
    return _receive(session)
