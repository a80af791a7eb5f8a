"""``infra: {local: {network: namespace}}``: each local replica in a network namespace of its
own on the server's bridge, so two replicas of one node both serve 0.0.0.0 on one declared
port; reached by name from a peer, by the server's probes and through the endpoint; nothing
of it left once the job ends and the server stops (real processes, root)."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import threading
import sys
import urllib.request
from pathlib import Path

import pytest
from conftest import kill_leftovers, submit, wait_for, wait_state

from corral.executors import scope_of
from corral.node.network import Bridge, NetworkError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")

SITE = """
nodes:
  - {name: box, gpus: 0, cpus: 8, memory: 32}
infra: {local: {network: namespace}}
"""

SERVER = """
import http.server, os, socket
me = os.environ["CORRAL_HOSTNAME"]
class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = me.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("0.0.0.0", 8000), Hello).serve_forever()
"""


@pytest.fixture
def site_config() -> str:
    return SITE


def _links(prefix: str) -> list[str]:
    return sorted(n for n in os.listdir("/sys/class/net") if n.startswith(prefix))


def _nat(table: str) -> str:
    return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout + \
        subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, text=True).stdout


OUTSIDE_NAME = "pypi.org"


def _resolves(name: str) -> bool:
    try:
        socket.getaddrinfo(name, 443)
        return True
    except OSError:
        return False


def _outside_listener():
    """An HTTP server on the machine's own outward address (the one its default route leaves
    from), which a replica reaches only by leaving its namespace through the bridge."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.77", 9))  # no packet is sent: it only picks the outward address
        addr = probe.getsockname()[0]
    httpd = http.server.ThreadingHTTPServer((addr, 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return addr, httpd.server_address[1], httpd


def _run(ws) -> tuple[int, bytes, bytes]:
    out, err = b"", b""
    while True:
        message = ws.receive()
        if message.get("bytes") is not None:
            if message["bytes"][0] == 1:
                out += message["bytes"][1:]
            else:
                err += message["bytes"][1:]
            continue
        said = json.loads(message["text"])
        if "exit" in said:
            return said["exit"], out, err


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def test_two_replicas_both_serve_0_0_0_0_on_one_port(corral_home: Path, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from conftest import bearer
    from corral.api.app import create_app
    from corral.server import build_state
    from corral.settings import Settings

    (tmp_path / "server.py").write_text(SERVER)
    outside, outside_port, listener = _outside_listener()
    out = tmp_path / "client.out"
    settings = Settings(home=corral_home, db_url=f"sqlite:///{tmp_path / 'corral.db'}", poll_interval_s=0.2)
    bridge_name = f"crl-{scope_of(settings)[:10]}"
    state = build_state(settings)
    try:
        with TestClient(create_app(state), headers=bearer(state, "alice")) as server:
            job = submit(server, f"""
name: duo
execution: parallel
primary_tasks: [client]
---
name: server
num_nodes: 2
ports: {{http: 8000}}
readiness_probe: {{http: {{port: http, path: /}}, period: 0.3s}}
liveness_probe: {{exec: "curl -sf --max-time 2 http://127.0.0.1:8000/", period: 0.5s}}
endpoint: {{port: http}}
run: exec {sys.executable} {tmp_path / 'server.py'}
---
name: client
depends_on: [{{task: server, condition: ready}}]
run: |
  for r in 0 1; do curl -sf --max-time 5 http://server-$r.duo:8000/ >> {out}; echo >> {out}; done
  echo "host=$CORRAL_HOST_ADDR addr=$CORRAL_ADDR" >> {out}
  ip -4 -o addr show dev eth0 >> {out}
  getent hosts {OUTSIDE_NAME} >/dev/null && echo resolved >> {out} || echo unresolved >> {out}
  curl -s --max-time 5 -o /dev/null http://{outside}:{outside_port}/ && echo outside >> {out} || echo no-outside >> {out}
  exec sleep 300
""")
            job_id = job["id"]
            wait_state(server, job_id, "RUNNING")
            wait_for(lambda: out.exists() and "outside" in out.read_text(), timeout=60)
            lines = out.read_text().splitlines()
            # both bound 0.0.0.0:8000 on one node, both ready, each reached by its name from a peer
            assert lines[:2] == ["server-0.duo", "server-1.duo"], lines
            status = server.get(f"/v1/jobs/{job_id}").json()
            servers = next(t for t in status["tasks"] if t["name"] == "server")
            assert all(r["ready"] and r["node"] == "box" for r in servers["replicas"]), servers
            addrs = {r["addr"] for r in servers["replicas"]}
            assert len(addrs) == 2 and all(a.startswith("10.") for a in addrs), addrs
            client = next(t for t in status["tasks"] if t["name"] == "client")["replicas"][0]
            gateway = Bridge(scope_of(settings), settings.home / "network")
            host_addr = lines[2].split()[0].removeprefix("host=")
            assert host_addr.startswith("10.") and host_addr.endswith(".0.1")  # the bridge's address
            assert lines[2] == f"host={host_addr} addr={client['addr']}"
            assert f"inet {client['addr']}/16" in lines[3], lines  # its own address, on its own eth0
            # names outside resolve where the machine's do (its resolv.conf may name a loopback stub);
            # the machine's own interface address, off the bridge, is reached through the gateway
            assert lines[4] == ("resolved" if _resolves(OUTSIDE_NAME) else "unresolved"), lines
            assert lines[5] == "outside", lines
            # the liveness probe (curl on the replica's own 127.0.0.1) ran in its namespace: no restarts
            assert all(r["restarts"] == 0 for r in servers["replicas"]), servers
            # a shell enters its network namespace too: its eth0, its 0.0.0.0:8000
            with server.websocket_connect(f"/v1/jobs/{job_id}/shell?replica=server-1") as ws:
                ws.send_text(json.dumps({"command": ["sh", "-c", "ip -4 -o addr show dev eth0; "
                                                     "curl -sf http://127.0.0.1:8000/"]}))
                code, said, _ = _run(ws)
            replica1 = next(r for r in servers["replicas"] if r["rank"] == 1)
            assert code == 0 and f"inet {replica1['addr']}/16" in said.decode(), said
            assert said.decode().endswith("server-1.duo"), said
            # the server reaches each replica at its address; the endpoint balances over both
            for addr in addrs:
                assert _get(f"http://{addr}:8000/").startswith("server-")
            endpoint = wait_for(lambda: servers.get("endpoint") or next(
                t for t in server.get(f"/v1/jobs/{job_id}").json()["tasks"] if t["name"] == "server")["endpoint"])
            wait_for(lambda: {_get(f"http://{endpoint}/") for _ in range(8)} == {"server-0.duo", "server-1.duo"},
                     timeout=15)
            assert len(_links("crh")) >= 3 and os.path.exists(f"/sys/class/net/{bridge_name}")
            assert gateway.name == bridge_name
            assert f"corral_{scope_of(settings)[:10]}" in _nat("")  # the replicas' MASQUERADE rule
            server.post(f"/v1/jobs/{job_id}/cancel")
            wait_state(server, job_id, "CANCELLED")
            # the job's veth pairs went with its namespaces; the bridge stays while the server runs
            wait_for(lambda: not os.listdir(f"/sys/class/net/{bridge_name}/brif"), timeout=15)
    finally:
        listener.shutdown()
        kill_leftovers(corral_home)
    wait_for(lambda: not os.path.exists(f"/sys/class/net/{bridge_name}"), timeout=15)
    table = f"corral_{scope_of(settings)[:10]}"
    assert table not in _nat(table)


def test_the_setting_is_refused_with_a_sentence(tmp_path: Path) -> None:
    from corral.site import load_site
    from corral.spec.loader import SpecError

    path = tmp_path / "config.yaml"
    path.write_text("infra: {local: {network: bridge}}\n")
    with pytest.raises(SpecError) as caught:
        load_site(path)
    assert "infra.local.network" in str(caught.value) and "namespace" in str(caught.value)
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("infra: {local: {network: namespace}}\n")
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                           "from corral.node.network import Bridge, NetworkError\n"
                           "from pathlib import Path\n"
                           "try:\n    Bridge('x', Path('/tmp/none')).open()\n"
                           "except NetworkError as e:\n    print(e)\n"], capture_output=True, text=True)
    assert "infra.local.network: namespace needs the server to run as root" in done.stdout, done.stderr
    assert NetworkError.__mro__[1] is RuntimeError


def test_containers_share_their_replica_s_network_namespace(corral_home: Path, tmp_path: Path) -> None:
    """Two container replicas of one node both serve 0.0.0.0:8000 (host networking inside the
    replica's own namespace), each reached at its bridge address."""
    from container_lab import IMAGE, SITE as CONTAINERS, ensure_image
    from fastapi.testclient import TestClient

    from conftest import bearer
    from corral.api.app import create_app
    from corral.server import build_state
    from corral.settings import Settings

    ensure_image()
    (corral_home / "config.yaml").write_text((corral_home / "config.yaml").read_text() + CONTAINERS)
    settings = Settings(home=corral_home, db_url=f"sqlite:///{tmp_path / 'corral.db'}", poll_interval_s=0.2)
    state = build_state(settings)
    try:
        with TestClient(create_app(state), headers=bearer(state, "alice")) as server:
            job = submit(server, f"""
name: boxes
num_nodes: 2
ports: {{http: 8000}}
resources: {{image_id: docker:{IMAGE}}}
readiness_probe: {{http: {{port: http, path: /}}, period: 0.3s}}
run: |
  mkdir -p /tmp/www && echo "$CORRAL_HOSTNAME" > /tmp/www/index.html
  exec httpd -f -p 8000 -h /tmp/www
""")
            wait_state(server, job["id"], "RUNNING", timeout=120)
            wait_for(lambda: all(r["ready"] for r in server.get(f"/v1/jobs/{job['id']}").json()["tasks"][0]["replicas"]),
                     timeout=120)
            replicas = server.get(f"/v1/jobs/{job['id']}").json()["tasks"][0]["replicas"]
            assert {_get(f"http://{r['addr']}:8000/").strip() for r in replicas} == {"boxes-0.boxes", "boxes-1.boxes"}
            server.post(f"/v1/jobs/{job['id']}/cancel")
            wait_state(server, job["id"], "CANCELLED", timeout=60)
    finally:
        kill_leftovers(corral_home)
    wait_for(lambda: not _links("crh") and not _links("crl-"), timeout=30)


def test_a_server_that_cannot_wire_namespaces_refuses_to_start(tmp_path: Path) -> None:
    """Without ``ip`` (here: on no PATH) the server refuses the setting with a sentence, and
    makes nothing."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("infra: {local: {network: namespace}}\n")
    before = _links("crl-")
    done = subprocess.run([sys.executable, "-m", "corral.server"], capture_output=True, text=True, timeout=120,
                          env={"HOME": str(tmp_path), "PATH": "/nonexistent", "CORRAL_HOME": str(home)})
    assert done.returncode == 2, done.stderr
    assert "the corral server cannot start: infra.local.network: namespace needs the 'ip' program" in done.stderr
    assert _links("crl-") == before
