"""One testcontainers class per mini-cluster role, each with its own wait-for-ready.

`up` creates and starts every container through these classes (`DockerContainer.start()`: create,
copy config and secrets in, start, wait), so `hpcbox cluster.up` and the test fixture share one start
path. Finding a running cluster again and `down` go by labels and do not need testcontainers.

testcontainers never pulls here: the node image is built locally before any start, and
``DockerClient.create`` pulls only an image the engine lacks. Its reaper (Ryuk) is an image from a
registry, so it is switched off and `down` removes what `up` made.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import docker.errors
from docker.models.containers import Container
from testcontainers.core.config import testcontainers_config
from testcontainers.core.container import DockerContainer
from testcontainers.core.network import Network
from testcontainers.core.waiting_utils import WaitStrategy, WaitStrategyTarget

from hpcbox.minicluster import slurmconf
from hpcbox.minicluster.cluster import Cluster, files_archive
from hpcbox.minicluster.shape import ClusterShape
from hpcbox.minicluster.spec import LABEL, USER, ClusterSpec, role
from hpcbox.tools import docker as engine
from hpcbox.tools import ssh

os.environ["TESTCONTAINERS_RYUK_DISABLED"] = "true"
# testcontainers reads the variable lazily, at the first start; set the value itself too, so that no
# import order and no user setting can bring the reaper back.
testcontainers_config.ryuk_disabled = True

HOST_LABEL = f"{LABEL}.host"
INIT_DIR = "/etc/hpcbox-init"
# The device numbers of the compute nodes' fake GPUs (hpcbox-node's fake_gpus): one Linux keeps for
# local use, so no driver is behind them.
FAKE_GPU_MAJOR = 120
POLL_S = 0.5
_ALIVE = ("created", "running")


class NodeNotReady(RuntimeError):
    """A node did not pass its readiness check: ``host``, and what was last seen of it."""

    def __init__(self, host: str, seen: str, hint: str = "") -> None:
        super().__init__(f"{host}: {seen}")
        self.host = host
        self.hint = hint


class NodeStopped(NodeNotReady):
    """A node's container stopped (or went) while `up` waited for it to be ready."""


class NodeReady(WaitStrategy):
    """Ready once ``probe(container)`` sees nothing missing (None); otherwise the probe says what it
    sees instead, which is what a timeout reports. A probe raises NodeNotReady for a state that does
    not end by itself; a container that stops meanwhile ends the wait at once."""

    def __init__(self, host: str, what: str, probe: Callable[[Container], str | None]) -> None:
        super().__init__()
        self.host = host
        self.what = what
        self.probe = probe

    def wait_until_ready(self, container: WaitStrategyTarget) -> None:
        self.wait_for(container.get_wrapped_container())

    def wait_for(self, container: Container) -> None:
        """Block until ``container`` (new or already running) passes the probe."""
        deadline = time.monotonic() + self._startup_timeout
        while True:
            try:
                container.reload()
            except docker.errors.NotFound as exc:
                removed = f"container {container.name} was removed before {self.what}"
                raise NodeStopped(self.host, removed) from exc
            if container.status not in _ALIVE:
                stopped = f"container {container.name} stopped ({container.status})"
                raise NodeStopped(self.host, f"{stopped} before {self.what}")
            seen = self.probe(container)
            if seen is None:
                return
            if time.monotonic() > deadline:
                raise NodeNotReady(self.host, f"{seen}, after {self._startup_timeout:.0f} s")
            time.sleep(self._poll_interval)


def _output(container: Container, argv: Sequence[str]) -> str | None:
    """stdout of ``argv`` run in ``container``, or None if it failed (or the container is going away)."""
    try:
        code, out = container.exec_run(list(argv))
    except docker.errors.APIError:
        return None
    return out.decode(errors="replace") if code == 0 else None


class ClusterNode(DockerContainer):
    """A mini-cluster container: named `<cluster>-<host>`, labelled for `down`, reachable on the cluster
    network by its host name, with the files `hpcbox-node` installs copied in before it starts."""

    role: ClassVar[str]

    def __init__(self, cluster: Cluster, host: str, network: Network, timeout_s: float) -> None:
        super().__init__(cluster.image)
        # As given: a TESTCONTAINERS_HUB_IMAGE_NAME_PREFIX would name an image that exists nowhere.
        self.image = cluster.image
        self.cluster = cluster
        self.host = host
        spec = cluster.spec
        self.with_name(spec.container(host)).with_command([self.role])
        self.with_network(network).with_network_aliases(host)
        self.with_kwargs(
            hostname=host, labels={LABEL: spec.name, HOST_LABEL: host}, init=True, **self.engine_options()
        )
        self.with_copy_into_container(files_archive(self.init_files(), under=INIT_DIR), "/")
        readiness = self.readiness(cluster, host).with_startup_timeout(timeout_s)
        self.waiting_for(readiness.with_poll_interval(POLL_S))

    def _transfer_into_container(self, archive: bytes, directory: str, mode: int = 0) -> None:
        """Unpack the archive of the init files into ``directory`` of the created container: one
        archive, where testcontainers' own transfer makes one of each file (a re-execution of dockerd
        each; a node has up to eight)."""
        engine.put_archive(
            self.get_wrapped_container(), directory, archive,
            what=f"write the init files into {self.cluster.name}'s {self.host}",
        )  # fmt: skip

    def engine_options(self) -> dict[str, Any]:
        """Extra `containers.create` options of this role."""
        return {}

    def init_files(self) -> dict[str, tuple[bytes, int]]:
        """Name -> (content, mode) for /etc/hpcbox-init: config everywhere, secrets only where needed."""
        files = slurmconf.config_files(self.cluster.spec, self.cluster.shape)
        return {**files, "munge.key": (self.cluster.secrets.munge_key.read_bytes(), 0o400)}

    def shared_volumes(self) -> None:
        """/home and /data, shared with the other nodes. `nocopy`: Docker would otherwise copy the
        image's /home into each fresh volume as every container mounts it, and containers starting
        side by side race in that copy ("mkdir .../_data/researcher: file exists"). The login node
        creates the user's folders in the empty volumes instead."""
        spec = self.cluster.spec
        self.with_volume_mapping(spec.home_volume, "/home", "rw,nocopy")
        self.with_volume_mapping(spec.data_volume, "/data", "rw,nocopy")

    @classmethod
    def readiness(cls, cluster: Cluster, host: str) -> NodeReady:
        raise NotImplementedError


class AccountingNode(ClusterNode):
    """MariaDB + slurmdbd: ready when slurmdbd answers and knows the cluster's user."""

    role = "accounting"

    def init_files(self) -> dict[str, tuple[bytes, int]]:
        password = self.cluster.secrets.db_password.read_text().strip()
        conf = slurmconf.slurmdbd_conf(self.cluster.spec, password).encode()
        return {**super().init_files(), "slurmdbd.conf": (conf, 0o600)}

    @classmethod
    def readiness(cls, cluster: Cluster, host: str) -> NodeReady:
        argv = ["sacctmgr", "--noheader", "--parsable2", "show", "user", USER]

        def knows_user(container: Container) -> str | None:
            if (_output(container, argv) or "").startswith(f"{USER}|"):
                return None
            return f"slurmdbd does not list user {USER} (yet)"

        return NodeReady(host, f"slurmdbd answer listing user {USER}", knows_user)


class ControllerNode(ClusterNode):
    """slurmctld: ready when `scontrol ping` says it is UP."""

    role = "controller"

    @classmethod
    def readiness(cls, cluster: Cluster, host: str) -> NodeReady:
        def is_up(container: Container) -> str | None:
            said = _output(container, ["scontrol", "ping"])
            if said is not None and "is UP" in said:
                return None
            return f"`scontrol ping` says {said.strip()!r}" if said else "`scontrol ping` fails"

        return NodeReady(host, "`scontrol ping` saying UP", is_up)


# Apptainer as an ordinary user: user namespaces and FUSE (no --privileged here).
_RUNTIME_OPTIONS: dict[str, Any] = {
    "security_opt": ["seccomp=unconfined", "apparmor=unconfined"],
    "devices": ["/dev/fuse:/dev/fuse:rwm"],
}


@dataclass(frozen=True)
class NodeState:
    """A compute node's state as sinfo's long form gives it (`mixed`, `down*`), and its reason."""

    # sinfo's states in which slurmctld gives a node jobs, whether or not it runs any now: a node busy
    # with the user's jobs is as up as an idle one.
    USABLE: ClassVar[frozenset[str]] = frozenset(
        {"idle", "mixed", "allocated", "completing", "planned", "reserved"}
    )
    # States only someone's `scontrol update nodename=... state=resume` ends (Slurm drains a node whose
    # job's processes outlived their kill, too).
    HELD: ClassVar[frozenset[str]] = frozenset({"drained", "draining", "drain"})
    # sinfo's state suffixes (man sinfo, NODE STATE CODES): what each says of the node.
    SUFFIXES: ClassVar[dict[str, str]] = {
        "*": "not responding", "~": "powered off", "#": "powering up", "!": "pending power down",
        "%": "powering down", "^": "rebooting", "@": "pending reboot", "$": "in a maintenance reservation",
        "-": "planned for a pending job", "+": "completing a job",
    }  # fmt: skip
    # The suffixes of a node that still takes jobs.
    USABLE_SUFFIXES: ClassVar[str] = "@$-+"
    SEPARATOR: ClassVar[str] = "|"

    base: str
    suffixes: str = ""
    reason: str = ""

    @classmethod
    def parse(cls, line: str) -> NodeState:
        """From `sinfo --format=%T|%E` (`down*|Not responding`); a reason of `none` is no reason."""
        text, _, reason = line.strip().partition(cls.SEPARATOR)
        base = text.rstrip("".join(cls.SUFFIXES))
        return cls(base.lower(), text[len(base) :], "" if reason.strip() == "none" else reason.strip())

    @property
    def usable(self) -> bool:
        return self.base in self.USABLE and all(mark in self.USABLE_SUFFIXES for mark in self.suffixes)

    @property
    def held(self) -> bool:
        return self.base in self.HELD

    def __str__(self) -> str:
        said = [self.SUFFIXES[mark] for mark in self.suffixes]
        if self.reason and self.reason.lower() not in said:
            said.append(f"reason: {self.reason}")
        return f"{self.base.upper()}{self.suffixes}" + (f" ({'; '.join(said)})" if said else "")


def compute_options(shape: ClusterShape) -> dict[str, Any]:
    """The `containers.create` options of a compute node of a cluster of ``shape``."""
    # jobacct_gather/linux drops every process whose /proc/<pid>/io it cannot read; for the user's
    # processes root needs SYS_PTRACE, or sacct's MaxRSS stays empty. task/affinity binds the
    # user's tasks to their CPUs: without SYS_NICE no job starts ("task_g_set_affinity: Operation
    # not permitted").
    options = {**_RUNTIME_OPTIONS, "cap_add": ["SYS_PTRACE", "SYS_NICE"]}
    if shape.cgroups:
        # slurmd's cgroups (slurmconf.enforcement): a cgroup namespace of the node's own, whose
        # root is the container's cgroup, so that each node's Slurm tree is apart from the others'
        # and /proc/<pid>/cgroup names the paths Slurm made; SYS_ADMIN for hpcbox-node to make its
        # cgroups writable (Docker mounts them read-only; --privileged fails here) and to let the
        # node's cgroup open its fake GPU devices (major 120, hpcbox-node), which Slurm's then deny
        # to every job but the one given each.
        options["cap_add"] = [*options["cap_add"], "SYS_ADMIN"]
        options["cgroupns"] = "private"
        if shape.cgroup_version == 2:
            # cgroup v2 filters devices with eBPF programs, the container's fixed by Docker at its
            # creation: it lets the node open every fake GPU (the ones a GPU type added later too),
            # and slurmd's own programs, below it, deny each job the others. slurmd loads and attaches
            # them; NET_ADMIN besides SYS_ADMIN, as SchedMD's Slinky gives its slurmd containers for them
            # (not tried without). (On v1 a rule of Docker's would be a wildcard Slurm's per-device
            # denials cannot carve: hpcbox-node allows each device there instead.)
            options["cap_add"].append("NET_ADMIN")
            options["device_cgroup_rules"] = [f"c {FAKE_GPU_MAJOR}:* rwm"]
    return options


class ComputeNode(ClusterNode):
    """slurmd + Apptainer: ready when slurmctld reports this node in a state that takes jobs (idle, or
    busy with jobs), not when it is down, not responding or drained."""

    role = "compute"

    def __init__(self, cluster: Cluster, host: str, network: Network, timeout_s: float) -> None:
        super().__init__(cluster, host, network, timeout_s)
        self.shared_volumes()

    def engine_options(self) -> dict[str, Any]:
        return compute_options(self.cluster.shape)

    @classmethod
    def readiness(cls, cluster: Cluster, host: str) -> NodeReady:
        argv = ["sinfo", "--noheader", "--Node", f"--nodes={host}", f"--format=%T{NodeState.SEPARATOR}%E"]

        def is_usable(container: Container) -> str | None:
            # One line per partition the node is in, each with the node's one state.
            lines = (_output(container, argv) or "").splitlines()
            if not lines:
                return "slurmctld does not list it (yet)"
            state = NodeState.parse(lines[0])
            if state.usable:
                return None
            if state.held:
                resume = ["docker", "exec", cluster.spec.container("controller"), "scontrol", "update"]
                resume += [f"nodename={host}", "state=resume"]
                raise NodeNotReady(
                    host, f"{state}, which lasts until it is resumed", f"resume it: `{shlex.join(resume)}`"
                )
            return str(state)

        return NodeReady(host, "a usable state in sinfo (idle, mixed, allocated...)", is_usable)


class LoginNode(ClusterNode):
    """sshd, published on 127.0.0.1 only: ready when it accepts the user's generated key."""

    role = "login"

    def __init__(self, cluster: Cluster, host: str, network: Network, timeout_s: float) -> None:
        super().__init__(cluster, host, network, timeout_s)
        self.shared_volumes()
        # with_bind_ports publishes on every interface; the login node must answer on loopback only.
        self.ports["22/tcp"] = ("127.0.0.1", cluster.spec.port)  # type: ignore[assignment]

    def engine_options(self) -> dict[str, Any]:
        # The compute nodes' container runtime and FUSE, as at a site whose nodes share their software:
        # what `hpcbox doctor` finds here, and the SIFs it runs here, are what a job meets.
        return dict(_RUNTIME_OPTIONS)

    def init_files(self) -> dict[str, tuple[bytes, int]]:
        secrets = self.cluster.secrets
        return {
            **super().init_files(),
            "ssh_host_ed25519_key": (secrets.host_key.read_bytes(), 0o600),
            "ssh_host_ed25519_key.pub": (Path(f"{secrets.host_key}.pub").read_bytes(), 0o644),
            "authorized_keys": ((secrets.public(secrets.user_key) + "\n").encode(), 0o600),
        }

    @classmethod
    def readiness(cls, cluster: Cluster, host: str) -> NodeReady:
        where = f"sshd on 127.0.0.1:{cluster.login_port}"

        def accepts_key(_container: Container) -> str | None:
            # A plain login, not a master: one refused while sshd starts is the answer "not yet" here.
            if ssh.run(cluster.ssh_target(), "true", check=False).returncode == 0:
                return None
            return f"{where} does not accept the key"

        return NodeReady(host, f"{where} accepting the key", accepts_key)


NODE_CLASSES: dict[str, type[ClusterNode]] = {
    node.role: node for node in (AccountingNode, ControllerNode, ComputeNode, LoginNode)
}


def node_class(host: str) -> type[ClusterNode]:
    return NODE_CLASSES[role(host)]


def network(spec: ClusterSpec) -> Network:
    """The cluster's bridge network (not yet created), named and labelled for `down`."""
    made = Network(docker_network_kw={"driver": "bridge", "labels": {LABEL: spec.name}})
    made.name = spec.network
    return made
