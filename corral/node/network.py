"""A network namespace per replica on the local executor (``infra: {local: {network: namespace}}``).

By default every local replica shares the machine's network stack and gets its own loopback
address: two replicas may listen on one port of *their* address, but ``0.0.0.0`` is the
machine's, so the second server that binds it (vLLM's and SGLang's default) fails. In
namespace mode each replica gets a network namespace of its own, as a Kubernetes pod or a
Docker container does: ``0.0.0.0`` is the replica's, and its address is on a bridge of
this server's (``crl-<scope>``, one per CORRAL_HOME, with a 10.X.0.0/16 subnet chosen
off the machine's routes). The bridge's own address is the way back to the machine
(``CORRAL_HOST_ADDR``); a MASQUERADE rule and IPv4 forwarding let replicas reach whatever
the machine reaches.

The namespace itself is made by the namespace thread (``corral.node.namespaces``) with the
mount and UTS ones; this module owns the bridge, its NAT rule, the resolver file replicas
read, and the wiring of one replica's namespace (a veth pair with the machine's end on the
bridge, ``lo``, the address, the default route), sent as rtnetlink requests in-process
(``corral.node.netlink``): two ``ip`` runs per start cost ~7 ms more, and a netlink
library would be a dependency for four messages. The bridge, made once per server, uses
``ip``. A replica's veth pair goes away with its namespace, that is when
its last process ends; the bridge and rule go when the server stops with no replica left
on the bridge (running replicas outlive a server restart, and the next server adopts them).
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import shutil
import socket
import struct
import subprocess
from pathlib import Path

from corral.node.netlink import Netlink

log = logging.getLogger("corral.network")

HOST_ADDR_VAR = "CORRAL_HOST_ADDR"
MODES = ("host", "namespace")


class NetworkError(RuntimeError):
    """This machine cannot give replicas namespaces of their own (the setting is refused)."""


def _ip(batch: str, what: str) -> None:
    done = subprocess.run(["ip", "-batch", "-"], input=batch.encode(), capture_output=True, timeout=20)
    if done.returncode != 0:
        raise OSError(f"{what}: {done.stderr.decode(errors='replace').strip() or 'ip failed'}")


def _routes() -> list[ipaddress.IPv4Network]:
    """The machine's IPv4 routes but the default one (/proc/net/route: little-endian hex)."""
    out = []
    try:
        lines = Path("/proc/net/route").read_text().splitlines()[1:]
    except OSError:
        return out
    for line in lines:
        fields = line.split()
        if len(fields) < 8:
            continue
        dest, mask = (socket.inet_ntoa(struct.pack("<I", int(f, 16))) for f in (fields[1], fields[7]))
        if mask != "0.0.0.0":
            out.append(ipaddress.IPv4Network(f"{dest}/{mask}", strict=False))
    return out


def _bridge_address(name: str) -> ipaddress.IPv4Interface | None:
    done = subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", name], capture_output=True, text=True)
    for word_list in (line.split() for line in done.stdout.splitlines()):
        if "inet" in word_list:
            return ipaddress.IPv4Interface(word_list[word_list.index("inet") + 1])
    return None


def _upstream_resolvers() -> str:
    """A resolv.conf whose servers a namespace can reach: the machine's own, unless it points
    at a loopback stub (systemd-resolved's 127.0.0.53), then the stub's upstream servers."""
    def servers(text: str) -> list[str]:
        return [line.split()[1] for line in text.splitlines() if line.startswith("nameserver") and len(line.split()) > 1]

    def loopback(addr: str) -> bool:
        try:
            return ipaddress.ip_address(addr).is_loopback
        except ValueError:
            return True

    try:
        text = Path("/etc/resolv.conf").read_text()
    except OSError:
        return ""
    if all(not loopback(s) for s in servers(text)):
        return text
    for other in ("/run/systemd/resolve/resolv.conf", "/run/NetworkManager/no-stub-resolv.conf"):
        try:
            upstream = Path(other).read_text()
        except OSError:
            continue
        if servers(upstream) and all(not loopback(s) for s in servers(upstream)):
            return upstream
    kept = [line for line in text.splitlines() if not (line.startswith("nameserver") and loopback(line.split()[1]))]
    log.warning("/etc/resolv.conf only names loopback servers and no upstream list was found: replicas in their "
                "own network namespaces may not resolve outside names")
    return "\n".join(kept) + "\n"


class Bridge:
    """This server's bridge: made (or found, after a restart) at start, removed at stop."""

    def __init__(self, scope: str, state_dir: Path):
        self.name = f"crl-{scope[:10]}"
        self.table = f"corral_{scope[:10]}"
        self.state_dir = state_dir
        self.resolv_conf = state_dir / "resolv.conf"
        self.gateway: ipaddress.IPv4Interface | None = None
        self.index = 0  # the bridge's interface index, once open
        self._nat = "nft" if shutil.which("nft") else ("iptables" if shutil.which("iptables") else "")

    # -- the bridge --------------------------------------------------------------------------
    def open(self) -> None:
        """Make the bridge, its NAT rule and forwarding, or refuse with a sentence."""
        if os.geteuid() != 0:
            raise NetworkError("infra.local.network: namespace needs the server to run as root (it makes a "
                               "network namespace, a veth pair and a bridge per replica); use network: host")
        for tool in ("ip", "unshare"):
            if shutil.which(tool) is None:
                raise NetworkError(f"infra.local.network: namespace needs the {tool!r} program, not found on PATH")
        if not self._nat:
            raise NetworkError("infra.local.network: namespace needs nft or iptables (for the replicas' NAT rule)")
        self.gateway = _bridge_address(self.name)
        try:
            if self.gateway is None:
                subnet = self._free_subnet()
                self.gateway = ipaddress.IPv4Interface(f"{subnet.network_address + 1}/{subnet.prefixlen}")
                _ip(f"link add {self.name} type bridge\naddr add {self.gateway} dev {self.name}\n"
                    f"link set {self.name} up\n", f"making the bridge {self.name}")
            self._forwarding()
            self._masquerade(add=True)
            self._try_namespace()
        except (OSError, subprocess.SubprocessError) as exc:
            self.close(force=True)
            raise NetworkError(f"infra.local.network: namespace is not possible on this machine ({exc}); "
                               "use network: host") from None
        self.index = socket.if_nametoindex(self.name)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.resolv_conf.write_text(_upstream_resolvers())
        os.chmod(self.resolv_conf, 0o644)

    def _free_subnet(self) -> ipaddress.IPv4Network:
        taken = _routes()
        first = int(hashlib.sha1(self.name.encode()).hexdigest(), 16) % 200 + 20  # 10.20-219: one per home, mostly
        for step in range(236):
            subnet = ipaddress.IPv4Network(f"10.{(first + step - 20) % 236 + 20}.0.0/16")
            if not any(subnet.overlaps(route) for route in taken):
                return subnet
        raise OSError("every 10.20-255.0.0/16 subnet overlaps one of the machine's routes")

    def _forwarding(self) -> None:
        path = Path("/proc/sys/net/ipv4/ip_forward")
        if path.read_text().strip() != "1":
            path.write_text("1\n")
            (self.state_dir).mkdir(parents=True, exist_ok=True)
            (self.state_dir / "ip_forward.was").write_text("0\n")  # put back when the bridge goes

    def _masquerade(self, add: bool) -> None:
        subnet = self.gateway.network if self.gateway else None
        if self._nat == "nft":
            subprocess.run(["nft", "delete", "table", "ip", self.table], capture_output=True)
            if add and subnet is not None:
                rules = (f"table ip {self.table} {{\n chain post {{\n  type nat hook postrouting priority 100; "
                         f"policy accept;\n  ip saddr {subnet} oifname != \"{self.name}\" masquerade\n }}\n}}\n")
                done = subprocess.run(["nft", "-f", "-"], input=rules.encode(), capture_output=True)
                if done.returncode != 0:
                    raise OSError(f"adding the NAT rule: {done.stderr.decode(errors='replace').strip()}")
            return
        if subnet is None:
            return
        rule = ["POSTROUTING", "-s", str(subnet), "!", "-o", self.name, "-j", "MASQUERADE",
                "-m", "comment", "--comment", self.table]
        while subprocess.run(["iptables", "-t", "nat", "-D", *rule], capture_output=True).returncode == 0:
            pass  # a rule a killed server left behind, once or more
        if add:
            done = subprocess.run(["iptables", "-t", "nat", "-A", *rule], capture_output=True)
            if done.returncode != 0:
                raise OSError(f"adding the NAT rule: {done.stderr.decode(errors='replace').strip()}")

    def _try_namespace(self) -> None:
        """One throw-away namespace wired as a replica's would be: proves the kernel allows it."""
        probe = f"crq{os.getpid() % 1000000:06d}"
        done = subprocess.run(["unshare", "--net", "ip", "-batch", "-"], capture_output=True, timeout=20,
                              input=(f"link set lo up\nlink add eth0 type veth peer name {probe} netns {os.getpid()}\n"
                                     ).encode())
        if done.returncode != 0:
            raise OSError(done.stderr.decode(errors="replace").strip() or "unshare --net failed")
        # the probe's namespace ended with its process, and the veth pair with it

    def attached(self) -> list[str]:
        """The machine's ends of the veth pairs of replicas still on the bridge."""
        try:
            return sorted(p.name for p in Path(f"/sys/class/net/{self.name}/brif").iterdir())
        except OSError:
            return []

    def close(self, force: bool = False) -> None:
        """Remove the bridge, its rule and forwarding, unless replicas still use them."""
        if not force and self.attached():
            log.info("bridge %s kept: replicas %s still run on it", self.name, ", ".join(self.attached()))
            return
        self._masquerade(add=False)
        if Path(f"/sys/class/net/{self.name}").exists():
            subprocess.run(["ip", "link", "del", self.name], capture_output=True)
        was = self.state_dir / "ip_forward.was"
        if was.exists():
            try:
                Path("/proc/sys/net/ipv4/ip_forward").write_text(was.read_text())
                was.unlink()
            except OSError:
                pass

    # -- a replica's wiring --------------------------------------------------------------------
    def address(self, replica_id: int) -> str:
        """10.X.b.c from the replica's row id (b 1-255, c 1-254: never the bridge's 10.X.0.1),
        so a restarted replica keeps its address; it wraps after 64,770 replicas."""
        assert self.gateway is not None
        index = (replica_id - 1) % (255 * 254)
        base = int(self.gateway.network.network_address)
        return str(ipaddress.IPv4Address(base + (1 + index // 254) * 256 + 1 + index % 254))

    def host_end(self, key: str) -> str:
        return "crh" + hashlib.sha1(key.encode()).hexdigest()[:12]

    def wire(self, address: str, host_end: str, host: Netlink) -> None:
        """Called on a thread inside the replica's fresh network namespace, with ``host`` a
        netlink socket of the server's: the pair (``eth0`` inside, ``host_end`` on the bridge),
        ``lo``, the address and the default route."""
        assert self.gateway is not None
        mine = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            host.add_veth(host_end, "eth0", mine, self.index)
        finally:
            os.close(mine)
        with Netlink() as inside:  # made here, so it speaks to the replica's namespace
            inside.up(socket.if_nametoindex("lo"), "lo")
            eth0 = socket.if_nametoindex("eth0")
            inside.add_address(eth0, address, self.gateway.network.prefixlen, "eth0")
            inside.up(eth0, "eth0")
            inside.add_default_route(str(self.gateway.ip))
