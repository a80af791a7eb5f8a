"""Ports on every infra, through a real server: a declared port is the port the replica
listens on, reached by name from a peer, and said so by ``CORRAL_PORT_*`` and the peers file;
two replicas declaring one port are never placed on one address (where nodes share one, as
the slurm-lab's do, they are not placed together at all); and a failed job names the replica
that failed on its own and why."""

from __future__ import annotations

import json
from pathlib import Path

from conformance.driver import Corral
from conformance.harnesses import PARTITION, describe

# a fixed port as a user declares one (8000 in vLLM's examples): one no other test here
# uses, since suites run side by side on this machine's network (the Slurm lab's and the Ray
# lab head's replicas share it); the Ray cases another, since with ``-n`` they run in another
# worker than the local and Slurm ones, at the same time (and a lab without network
# namespaces puts its workers' replicas on this machine's addresses too)
PORT = 8471
PORTS = {"ray": 8472}


def _port(harness) -> int:  # noqa: ANN001 - a Harness
    return PORTS.get(harness.name, PORT)

SERVER = """
import http.server, os, sys
me = os.environ["CORRAL_HOSTNAME"]
class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"{me} CORRAL_PORT_WEB={os.environ.get('CORRAL_PORT_WEB')}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
bind = sys.argv[1]
server = http.server.HTTPServer((bind, %d), Hello)
open(os.path.join(sys.argv[2], "bound-" + os.environ["CORRAL_LAUNCH_KEY"]), "w").close()  # its readiness
server.serve_forever()
"""

CLIENT = """
import json, os, sys, time, urllib.request
job, servers = os.environ["CORRAL_JOB_NAME"], int(sys.argv[1])
for rank in range(servers):
    url = f"http://server-{rank}.{job}:%d/"
    deadline = time.time() + 120
    while True:
        try:
            print("got", rank, urllib.request.urlopen(url, timeout=5).read().decode(), flush=True)
            break
        except OSError as exc:
            if time.time() > deadline:
                print("failed", rank, url, exc, flush=True)
                sys.exit(1)
            time.sleep(0.5)
peers = json.load(open(os.environ["CORRAL_PEERS_FILE"]))
for r in peers["tasks"]["server"]["replicas"]:
    print("peer", r["hostname"], r["addr"], json.dumps(r["ports"], separators=(",", ":")), json.dumps(r.get("moved_ports", {}), separators=(",", ":")), flush=True)
"""


def _group(work: Path, servers: int, bind: str, gpu_type: str, port: int) -> str:
    """Servers, and a client that asks each by name once every one has bound its port (ready):
    a replica binding 0.0.0.0 answers on its peers' addresses of one machine too, so a client
    asking sooner could be answered for a server that has not bound yet, or never can."""
    (work / "server.py").write_text(SERVER % port)
    (work / "client.py").write_text(CLIENT % port)
    return f"""
name: web
execution: parallel
primary_tasks: [client]
---
name: server
num_nodes: {servers}
resources: {{accelerators: {gpu_type}:1, ports: {{web: {port}}}}}
readiness_probe: {{exec: "test -e {work}/bound-$CORRAL_LAUNCH_KEY", period: 0.5s}}
run: exec python3 {work}/server.py {bind} {work}
---
name: client
depends_on: [{{task: server, condition: ready}}]
run: exec python3 {work}/client.py {servers}
"""


def _served(corral: Corral, job: int, servers: int) -> None:
    port = _port(corral.harness)
    done = corral.wait_job(job, timeout=180)
    assert done["state"] == "SUCCEEDED", describe(done)
    lines = corral("logs", str(job), "client-0").stdout.splitlines()
    for rank in range(servers):
        # the server bound the port it declared, and was reached on it by its name
        assert f"got {rank} server-{rank}.web CORRAL_PORT_WEB={port}" in lines, lines
    peers = [x.split() for x in lines if x.startswith("peer ")]
    assert len(peers) == servers, lines
    for _, name, addr, ports, moved in peers:
        assert json.loads(ports) == {"web": port} and json.loads(moved) == {}, (name, ports, moved)
    assert not [e for e in corral.events(job) if e["cause"] == "port-moved"], corral.events(job)


def test_a_server_binding_every_address_is_reached_on_its_declared_port(corral: Corral, harness, work: Path) -> None:
    # vLLM's default: bind 0.0.0.0 on the declared port
    job = corral.launch("web", _group(work, 1, "0.0.0.0", harness.gpu_type, _port(harness)))
    _served(corral, job, 1)


def test_two_replicas_declaring_one_port_both_serve_on_it_by_name(corral: Corral, harness, work: Path) -> None:
    if harness.name == "slurm":
        return _never_together_on_one_address(corral, work, harness.gpu_type)
    # Replicas on the local executor each have an address of their own on this machine (not a
    # network of their own, unless network: namespace): they serve their declared port on it;
    # binding 0.0.0.0 there is what two replicas of one machine cannot both do. Elsewhere (and in
    # network namespaces of their own) they bind 0.0.0.0.
    shared = harness.name == "local" and getattr(harness, "network", "host") == "host"
    bind = "$CORRAL_ADDR" if shared else "0.0.0.0"
    job = corral.launch("web", _group(work, 2, bind, harness.gpu_type, _port(harness)))
    _served(corral, job, 2)
    reps = corral.replicas(job)
    assert reps["server-0"]["addr"] != reps["server-1"]["addr"], describe(corral.status(job))
    if shared:
        # both binding 0.0.0.0 on one machine: the second cannot, and the job says so and how
        job = corral.launch("web", _group(work, 2, "0.0.0.0", harness.gpu_type, _port(harness)))
        done = corral.wait_job(job, timeout=180)
        message = done.get("message") or ""
        assert done["state"] == "FAILED" and "a port it binds is already in use" in message, describe(done)
        assert "$CORRAL_ADDR, not 0.0.0.0" in message, describe(done)


def _never_together_on_one_address(corral: Corral, work: Path, gpu_type: str) -> None:
    """The slurm-lab's nodes are processes of one machine (loopback addresses, one network
    stack): two replicas holding one port could never run there at once; refused at submit."""
    path = corral.specs / "web.yaml"
    path.write_text(_group(work, 2, "0.0.0.0", gpu_type, PORT))
    out = corral("launch", "-d", "-p", PARTITION, "--name", "web", str(path), check=False)
    assert out.returncode != 0, out.stdout
    assert f"2 replicas declare port {PORT}" in out.stderr and "address" in out.stderr, out.stderr


def test_a_failed_job_names_the_replica_that_failed_and_why(corral: Corral, work: Path) -> None:
    # the client waits for every server to be ready; server-1 fails at once (as a second
    # server failing to bind would): the job's message names server-1 and its exit code, not
    # the client that never started because of it
    job = corral.launch("blame", """
name: blame
execution: parallel
primary_tasks: [client]
---
name: server
num_nodes: 2
readiness_probe: {exec: "true", initial_delay: 2s, period: 0.5s}
run: |
  if [ "$CORRAL_REPLICA" = 1 ]; then echo "OSError: [Errno 98] Address already in use" >&2; exit 1; fi
  exec sleep 300
---
name: client
depends_on: [{task: server, condition: ready}]
run: echo never
""")
    done = corral.wait_job(job, timeout=120)
    assert done["state"] == "FAILED", describe(done)
    message = done.get("message") or ""
    assert "replica server-1 failed first (exit code 1" in message, describe(done)
    assert "a port it binds is already in use" in message, describe(done)  # what its log said
    assert message.startswith("primary replica client-0 failed"), describe(done)
    assert "lost or killed" not in message, describe(done)
