"""What ``up`` records about a running dev cluster, in ``/dev/shm/qwen-devcluster-<name>/state.json``:
ports, pids and executables of its processes, enough for ``down`` and ``status`` of a later process."""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import components, pki, procs

STATE_ROOT = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
STATE_PREFIX = "qwen-devcluster-"


def state_dir(name: str) -> Path:
    """Runtime directory of dev cluster ``name`` (on tmpfs where available)."""
    return STATE_ROOT / f"{STATE_PREFIX}{name}"


@dataclass
class State:
    """What ``up`` recorded about a running cluster: enough for ``down`` and ``status``."""

    name: str
    ports: dict[str, int]
    advertise_address: str
    executables: dict[str, str]
    pids: dict[str, int] = field(default_factory=dict)
    #: The apiserver's address: 127.0.0.1, or the bridge's with a real node.
    bind_address: str = "127.0.0.1"
    real_node: bool = False
    #: The checkout that started it: its `.devcluster/<name>/` holds the kubeconfig the tests read.
    checkout: str = ""

    @property
    def dir(self) -> Path:
        return state_dir(self.name)

    def save(self) -> None:
        (self.dir / "state.json").write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, name: str) -> State | None:
        try:
            return cls(**json.loads((state_dir(name) / "state.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def layout(self) -> components.Layout:
        pki_files = pki.load(self.dir / "pki")
        return components.Layout(
            self.dir, self.ports, pki_files, self.advertise_address, self.bind_address, self.real_node
        )

    def log_file(self, component: str) -> Path:
        return self.dir / "logs" / f"{component}.log"

    def running(self, component: str) -> bool:
        pid = self.pids.get(component)
        return pid is not None and procs.running(pid, self.executables[component])
