"""A fake infra that a real corral server loads through the ``corral.infras`` entry point
(``install`` writes the entry point into a directory put on the server's PYTHONPATH): an
engine with one node whose reachability a test flips by writing a file. While the file
holds a sentence, the engine "does not answer" (``Reachability``): no nodes, that sentence
as the reason; once it is empty, its node is back. Attempts "run" at once and exit 0."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from corral.executors.contract import Binding, EventStream, Kind, Launch, Observed, Started
from corral.executors.registry import Infra
from corral.pool import NodeSpec
from corral.spec.base import Strict


class FakeConfig(Strict):
    down_file: str  # while it holds a sentence, the engine does not answer, for that reason
    build_delay: float = 0.0  # seconds the executor takes to be built (a slow engine client)


class FlippingExecutor(EventStream):
    name = "fake"

    def __init__(self, config: FakeConfig, wake):  # noqa: ANN001
        super().__init__(wake)
        time.sleep(config.build_delay)
        self.down_file = Path(config.down_file)
        self._why: str | None = None
        self.version = 0
        self._closed = threading.Event()
        self._look()
        threading.Thread(target=self._watch, daemon=True).start()

    def _look(self) -> None:
        try:
            why = self.down_file.read_text().strip() or None
        except OSError:
            why = None
        if why != self._why:
            self._why = why
            self.version += 1
            self._wake_loop()

    def _watch(self) -> None:  # the engine's own health check, off the loop's thread
        while not self._closed.wait(0.2):
            self._look()

    def unreachable(self) -> str | None:
        return self._why

    def nodes(self) -> list[NodeSpec]:
        return [] if self._why else [NodeSpec(name="fk-0", gpus=4, gpu_type="H100", cpus=8, memory=64)]

    @property
    def inventory_version(self) -> int:
        return self.version

    def bind(self, job_id, replica_id, node, ports, previous) -> Binding:  # noqa: ANN001
        return Binding("127.0.0.1", dict(ports))

    def rendezvous_port(self, node: str) -> int:
        return 29500

    def start(self, launch: Launch) -> Started:
        handle = {"key": launch.key, "node": launch.node}
        Path(self.down_file.parent / f"started-{launch.key}").write_text(launch.node)
        threading.Timer(0.2, lambda: self._emit(Observed(launch.key, Kind.EXITED, code=0))).start()
        return Started(handle, confirmed=True)

    def adopt(self, attempts) -> None:  # noqa: ANN001
        for key, _ in attempts:
            self._emit(Observed(key, Kind.EXITED, code=0))

    def signal(self, handle, signum: int) -> bool:  # noqa: ANN001
        return False

    def forget(self, handle) -> None:  # noqa: ANN001
        return None

    def publish(self, job_id, nodes, hosts, peers) -> None:  # noqa: ANN001
        return None

    def attempt_env(self, job_id: int) -> dict[str, str]:
        return {}

    def release(self, job_id: int) -> None:
        return None

    def cleanup_job(self, job_id: int) -> None:
        return None

    def close(self) -> None:
        self._closed.set()


INFRA = Infra(name="fake", config=FakeConfig, build=lambda settings, config, nodes, wake: FlippingExecutor(config, wake),
              partition_nodes=lambda config, patterns, declared: ("fk-*",), runtime_nodes=lambda config: True)


def install(where: Path) -> str:
    """Make ``where`` a directory whose entry point registers this infra; the PYTHONPATH a
    server needs to load it."""
    info = where / "corral_fake_infra-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: corral-fake-infra\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[corral.infras]\nfake = fake_infra:INFRA\n")
    here = str(Path(__file__).parent)
    return os.pathsep.join([str(where), here, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
