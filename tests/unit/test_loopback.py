"""A home's block of loopback addresses, claimed machine-wide, and who answers on an address:
real locks in a temporary claims directory, real sockets of this process."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from corral.node import listeners
from corral.node.loopback import BLOCKS, LoopbackBlock, address


def test_two_homes_hold_two_blocks_and_a_home_gets_its_block_back(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    first, second = LoopbackBlock.claim(a, claims), LoopbackBlock.claim(b, claims)
    assert first.claimed and second.claimed and first.number != second.number
    assert first.address(1) != second.address(1)
    assert oct(claims.stat().st_mode)[-4:] == "1777"  # every account may claim, none remove another's
    kept = first.number
    first.close()  # the server stops (or dies: its descriptor goes with it)
    back = LoopbackBlock.claim(a, claims)
    assert back.number == kept and back.address(7) == address(kept, 7)
    # while a home's server is down, another home may take its block: it then gets another
    taken = LoopbackBlock.claim(b, claims)  # (b's second block, standing in for a third home)
    back.close()
    thief = tmp_path / "thief"
    thief.mkdir()
    (thief / "loopback-block").write_text(f"{kept}\n")
    stolen = LoopbackBlock.claim(thief, claims)
    assert stolen.number == kept
    moved = LoopbackBlock.claim(a, claims)
    assert moved.claimed and moved.number not in (kept, second.number, taken.number)
    for block in (stolen, moved, taken, second):
        block.close()


def test_with_every_block_held_a_home_falls_back_unclaimed(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    held = []
    for i in BLOCKS:
        home = tmp_path / f"h{i}"
        home.mkdir()
        held.append(LoopbackBlock.claim(home, claims))
    assert len({h.number for h in held}) == len(BLOCKS) and all(h.claimed for h in held)
    late = tmp_path / "late"
    late.mkdir()
    fallback = LoopbackBlock.claim(late, claims)
    assert not fallback.claimed and fallback.number in BLOCKS
    for h in held:
        h.close()


def test_addresses_stay_inside_the_block_and_skip_net_and_broadcast() -> None:
    seen = {address(9, i) for i in range(1, 256 * 254 + 1)}
    assert len(seen) == 256 * 254
    assert all(a.startswith("127.9.") and not a.endswith((".0", ".255")) for a in seen)
    assert address(9, 256 * 254 + 1) == address(9, 1)  # it wraps, within the block


def _listen(addr: str) -> socket.socket:
    sock = socket.socket()
    sock.bind((addr, 0))
    sock.listen()
    return sock


def test_the_process_holding_the_socket_is_who_answers() -> None:
    exact = _listen("127.77.0.1")
    port = exact.getsockname()[1]
    try:
        assert listeners.who_answers("127.77.0.1", port, [os.getpid()]) is None
        said = listeners.who_answers("127.77.0.1", port, [1])
        assert said is not None and "not this replica's" in said and "127.77.0.1" in said
        assert listeners.who_answers("127.77.0.2", port, [os.getpid()]) == f"nothing listens on 127.77.0.2:{port}"
    finally:
        exact.close()


def test_a_socket_on_every_address_answers_for_each_of_them() -> None:
    wildcard = _listen("0.0.0.0")
    port = wildcard.getsockname()[1]
    try:
        assert listeners.who_answers("127.77.0.9", port, [os.getpid()]) is None
        said = listeners.who_answers("127.77.0.9", port, [1])
        assert said is not None and "every address" in said
    finally:
        wildcard.close()


def test_a_replica_stopped_by_a_signal_is_not_said_to_have_lost_its_port(tmp_path: Path) -> None:
    # its log still holds an earlier attempt's bind failure; this attempt was stopped (143)
    from corral.runtime.logs import last_words

    log = tmp_path / "server-1.log"
    log.write_text("OSError: [Errno 98] Address already in use\nserving on 127.1.0.2:8000\n")
    assert last_words(log, code=143) == "" and last_words(log, code=-9) == ""
    assert "a port it binds is already in use" in last_words(log, code=1)
