"""Containers for tests, without any network: a busybox image imported from this machine's
``busybox-static`` (built once, kept in the engine's store), and a real private registry
(the distribution registry from Debian's ``docker-registry``, htpasswd auth, on loopback)
holding that image under a private name.

Podman here needs ``--runtime runc`` (``crun`` fails on the hybrid cgroup layout) and
explicit ulimits (the sandbox lacks CAP_SYS_RESOURCE): ``SITE`` is the config.yaml section
that says so, as an operator of such machines would."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

MARKER = "/corral-image"  # a file only the image has: where it exists, the replica is inside
SITE = """
containers:
  run_options: [--runtime, runc, --ulimit, nofile=20000:20000, --ulimit, nproc=4096:4096]
"""
APPLETS = ("sh", "ls", "cat", "echo", "id", "env", "sleep", "hostname", "pwd", "true", "false", "kill", "ps",
           "mkdir", "touch", "grep", "test", "httpd", "wget", "nc", "cut", "sort", "head", "tail", "printf", "stat")
PAGE = "served from a container\n"
# named for what it holds, so a changed recipe is a new image, never a stale one from the store
IMAGE = "localhost/corral-test/busybox:" + hashlib.sha256(repr((APPLETS, MARKER, PAGE)).encode()).hexdigest()[:12]


def need_podman() -> str:
    podman = shutil.which("podman")
    if podman is None or shutil.which("runc") is None:
        pytest.skip("podman and runc are needed to run containers (apt-get install podman runc)")
    if not Path("/bin/busybox").exists():
        pytest.skip("the test image is made from busybox-static (apt-get install busybox-static)")
    return podman


# the variant: an ENTRYPOINT of its own (which corral must set aside) and a "bash" that says
# it ran (the busybox build has no bash applet), to show setup and run prefer bash
ENTRYPOINT_IMAGE = IMAGE.replace("busybox:", "busybox-entrypoint:")
FAKE_BASH = '#!/bin/sh\nexport RAN_BY_BASH=yes\nexec /bin/sh "$@"\n'


def ensure_image(variant: str = "") -> str:
    """The test image (or its ``entrypoint`` variant), imported once per machine (kept in the
    engine's store)."""
    podman = need_podman()
    image = ENTRYPOINT_IMAGE if variant == "entrypoint" else IMAGE
    if subprocess.run([podman, "image", "exists", image]).returncode == 0:
        return image
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        for d in ("bin", "etc", "tmp", "www"):
            (root / d).mkdir(parents=True)
        (root / "tmp").chmod(0o1777)
        shutil.copy("/bin/busybox", root / "bin" / "busybox")
        for applet in APPLETS:
            (root / "bin" / applet).symlink_to("busybox")
        (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        (root / "etc" / "group").write_text("root:x:0:\n")
        (root / MARKER.lstrip("/")).write_text("inside\n")
        (root / "www" / "index.html").write_text(PAGE)
        changes = ["--change", "ENV=PATH=/bin"]
        if variant == "entrypoint":
            (root / "bin" / "bash").write_text(FAKE_BASH)
            (root / "bin" / "bash").chmod(0o755)
            changes += ["--change", 'ENTRYPOINT ["/bin/echo", "FROM-ENTRYPOINT"]']
        tar = Path(tmp) / "rootfs.tar"
        with tarfile.open(tar, "w") as out:
            out.add(root, arcname=".")
        subprocess.run([podman, "import", "-q", *changes, str(tar), image], check=True, capture_output=True)
    return image


def ensure_image_for(user: str, variant: str = "") -> str:
    """The test image in a Unix account's own image store (its jobs run in containers of its
    own, rootless engine), copied from root's without any network."""
    image = ensure_image(variant)
    podman = need_podman()
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        archive = Path(tmp) / "image.tar"
        subprocess.run([podman, "save", "-q", "-o", str(archive), image], check=True, capture_output=True)
        archive.chmod(0o644)
        subprocess.run(["setpriv", "--reuid", user, "--regid", user, "--init-groups", "--", "env", "-i",
                        f"HOME={os.path.expanduser('~' + user)}", f"USER={user}", "PATH=/usr/bin:/bin",
                        podman, "load", "-q", "-i", str(archive)], check=True, capture_output=True, cwd=tmp)
    return image


def containers_of(scope_label: str | None = None) -> list[str]:
    """Names of corral's containers on this machine (any state), of one home's scope or all."""
    podman = need_podman()
    label = f"label=corral.scope={scope_label}" if scope_label else "label=corral.key"
    done = subprocess.run([podman, "ps", "-a", "--filter", label, "--format", "{{.Names}}"], capture_output=True,
                          text=True, check=True)
    return done.stdout.split()


@dataclass
class Registry:
    address: str  # 127.0.0.1:PORT
    user: str
    password: str
    proc: subprocess.Popen
    conf: Path  # the registries.conf.d entry marking it insecure (plain HTTP)
    root: Path

    def image(self, name: str) -> str:
        return f"{self.address}/{name}"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)
        self.conf.unlink(missing_ok=True)
        shutil.rmtree(self.root, ignore_errors=True)


def start_registry(private: str = "private/busybox:1", host: str = "127.0.0.1") -> Registry:
    """A registry on ``host`` (loopback; a Ray lab's bridge for its workers) that wants a
    login, holding the test image as ``private``."""
    podman = need_podman()
    server, htpasswd = shutil.which("docker-registry"), shutil.which("htpasswd")
    if server is None or htpasswd is None:
        pytest.skip("a private registry needs docker-registry and htpasswd (apt-get install docker-registry "
                    "apache2-utils)")
    image = ensure_image()
    root = Path(tempfile.mkdtemp(prefix="corral-registry-"))
    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    user, password = "corral", "s3cret-" + os.urandom(4).hex()
    subprocess.run([htpasswd, "-Bbc", str(root / "htpasswd"), user, password], check=True, capture_output=True)
    (root / "config.yml").write_text(f"""version: 0.1
log: {{level: error}}
storage: {{filesystem: {{rootdirectory: {root / 'data'}}}}}
http: {{addr: {host}:{port}}}
auth: {{htpasswd: {{realm: corral-test, path: {root / 'htpasswd'}}}}}
""")
    proc = subprocess.Popen([server, "serve", str(root / "config.yml")], stdout=subprocess.DEVNULL,
                            stderr=open(root / "registry.log", "wb"), start_new_session=True)
    conf = Path("/etc/containers/registries.conf.d") / f"corral-test-{port}.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(f'[[registry]]\nlocation = "{host}:{port}"\ninsecure = true\n')
    registry = Registry(f"{host}:{port}", user, password, proc, conf, root)
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                registry.stop()
                raise RuntimeError(f"the registry did not start: {(root / 'registry.log').read_text()[-500:]}")
            time.sleep(0.1)
    target = registry.image(private)
    subprocess.run([podman, "tag", image, target], check=True, capture_output=True)
    subprocess.run([podman, "push", "-q", "--creds", f"{user}:{password}", target], check=True, capture_output=True)
    subprocess.run([podman, "rmi", "-f", target], capture_output=True)  # only the registry has it now
    return registry


# A job whose program (not its run's shell) saves its work on SIGTERM for 2 s: in the log, "up",
# then "got TERM" and "saved" once stopped, and never "after" (the run's shell starts nothing more)
GRACED = f"""
name: graced
resources: {{image_id: docker:{IMAGE}, accelerators: H100:1}}
grace_period: 15s
run: |
  sh -c "trap 'echo got TERM; sleep 2; echo saved; exit 0' TERM; echo up; while :; do sleep 0.1; done"
  echo after
"""
