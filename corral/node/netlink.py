"""The few rtnetlink requests that wire a replica's network namespace, made in-process.

Starting ``ip`` costs ~3.3 ms a run on a busy 2-core machine, and a replica's wiring needed
two (one inside its namespace, one outside): five times what the namespace thread's start
costs otherwise. The requests themselves take microseconds, so they are sent here on
netlink sockets. A netlink socket speaks to the network namespace it was created in,
whichever namespace its thread is in later: the namespace thread keeps one made in the
server's namespace and makes one inside each replica's, so it never has to go back and
forth between them. Only what corral sends is encoded (a veth pair with its peer in another
namespace, a link's flags, an IPv4 address, a default route); every request is acknowledged,
and an error is raised with the kernel's errno.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct

NETLINK_ROUTE = 0
RTM_NEWLINK, RTM_NEWADDR, RTM_NEWROUTE = 16, 20, 24
NLMSG_ERROR = 2
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
IFF_UP = 0x1
IFLA_IFNAME, IFLA_MASTER, IFLA_LINKINFO, IFLA_NET_NS_FD = 3, 10, 18, 28
IFLA_INFO_KIND, IFLA_INFO_DATA = 1, 2
VETH_INFO_PEER = 1
IFA_ADDRESS, IFA_LOCAL = 1, 2
RTA_GATEWAY = 5
RT_TABLE_MAIN, RTPROT_BOOT, RT_SCOPE_UNIVERSE, RTN_UNICAST = 254, 3, 0, 1
NLA_F_NESTED = 0x8000


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _name(text: str) -> bytes:
    return text.encode() + b"\0"


def _ifinfo(index: int = 0, flags: int = 0, change: int = 0) -> bytes:
    return struct.pack("=BxHiII", socket.AF_UNSPEC, 0, index, flags, change)


class Netlink:
    """An rtnetlink socket of the network namespace the calling thread is in when it is made."""

    _seq = itertools.count(1)

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
        self.sock.bind((0, 0))

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Netlink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, kind: int, flags: int, body: bytes, what: str) -> None:
        seq = next(self._seq)
        self.sock.send(struct.pack("=IHHII", 16 + len(body), kind, NLM_F_REQUEST | NLM_F_ACK | flags, seq, 0) + body)
        while True:
            data = self.sock.recv(65536)
            offset = 0
            while offset + 16 <= len(data):
                length, msg_type, _, msg_seq, _ = struct.unpack_from("=IHHII", data, offset)
                if msg_type == NLMSG_ERROR and msg_seq == seq:
                    (error,) = struct.unpack_from("=i", data, offset + 16)
                    if error:
                        raise OSError(-error, f"{what}: {os.strerror(-error)}")
                    return
                offset += max(length + (-length % 4), 16)

    def add_veth(self, name: str, peer: str, peer_netns_fd: int, master: int) -> None:
        """A veth pair: ``name`` here, up and on the bridge of index ``master``; ``peer`` in the
        namespace ``peer_netns_fd`` names (down until it is configured there)."""
        peer_info = _ifinfo() + _attr(IFLA_IFNAME, _name(peer)) + _attr(IFLA_NET_NS_FD, struct.pack("=I", peer_netns_fd))
        info = _attr(IFLA_INFO_KIND, _name("veth")) + \
            _attr(IFLA_INFO_DATA | NLA_F_NESTED, _attr(VETH_INFO_PEER | NLA_F_NESTED, peer_info))
        body = _ifinfo(0, IFF_UP, IFF_UP) + _attr(IFLA_IFNAME, _name(name)) + \
            _attr(IFLA_MASTER, struct.pack("=I", master)) + _attr(IFLA_LINKINFO | NLA_F_NESTED, info)
        self._request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body, f"creating the veth pair {name}/{peer}")

    def up(self, index: int, what: str) -> None:
        self._request(RTM_NEWLINK, 0, _ifinfo(index, IFF_UP, IFF_UP), f"setting {what} up")

    def add_address(self, index: int, address: str, prefixlen: int, what: str) -> None:
        packed = socket.inet_aton(address)
        body = struct.pack("=BBBBI", socket.AF_INET, prefixlen, 0, RT_SCOPE_UNIVERSE, index) + \
            _attr(IFA_LOCAL, packed) + _attr(IFA_ADDRESS, packed)
        self._request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, body, f"giving {what} the address {address}")

    def add_default_route(self, gateway: str) -> None:
        body = struct.pack("=BBBBBBBBI", socket.AF_INET, 0, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, RT_SCOPE_UNIVERSE,
                           RTN_UNICAST, 0) + _attr(RTA_GATEWAY, socket.inet_aton(gateway))
        self._request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, body, f"adding the default route via {gateway}")
