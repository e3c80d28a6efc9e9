"""What a mini cluster is: its validated settings and the names of everything it creates."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from hpcbox.errors import HpcboxError
from hpcbox.minicluster import versions

DEFAULT_NAME = "hpcbox-local"
DEFAULT_PORT = 2222
DEFAULT_NODES = 2
MAX_NODES = 16


def cluster_command(verb: str, name: str, *flags: str) -> str:
    """`hpcbox cluster.<verb>` for the mini cluster named ``name`` (the default one needs no --name)."""
    named = [] if name == DEFAULT_NAME else [f"--name={name}"]
    return shlex.join(["hpcbox", f"cluster.{verb}", *named, *flags])


USER = "researcher"
LABEL = "io.hpcbox.minicluster"
STATE_VARIABLE = "HPCBOX_MINICLUSTER_STATE"  # the state root, instead of the user's (tests name their own)
# Node sizes of a cluster shaped like a site (no profile knows them): large enough that sbatch checks
# only what the profile knows. A job's own request is enforced within them (slurmconf.py).
REHEARSAL_CPUS_PER_NODE = 64
REHEARSAL_MEMORY_MB_PER_NODE = 256_000
RUNTIMES = ("apptainer", "singularity")
_NAME = re.compile(r"^[a-z][a-z0-9-]{1,38}[a-z0-9]$")
_GPU_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class ClusterSpec:
    """Settings of one mini cluster. ``name`` prefixes every container, network and volume it makes."""

    name: str = DEFAULT_NAME
    nodes: int = DEFAULT_NODES
    port: int = DEFAULT_PORT
    gpus_per_node: int = 2  # where the profile it is shaped like does not say
    cpus_per_node: int = 2
    memory_mb_per_node: int = 2000
    like: str = "local"  # the cluster profile whose Slurm it rehearses (see shape.py)
    slurm: str = versions.DEFAULT  # the Slurm version every node runs (versions.py)
    # GPU types a rehearsal's jobs named that its profile leaves unknown, beside the profile's own
    # (lifecycle.add_gpu_type): the site may well have them.
    added_gpu_types: tuple[str, ...] = ()
    # The container runtime and FUSE of the compute nodes, where `cluster.up` overrides its profile's
    # (None: as the profile says); changed on a running cluster in place (lifecycle.up).
    runtime: str | None = None
    fuse: bool | None = None
    # What reads a SIF's squashfs on the nodes (None: all of it, as on every node image here): no
    # squashfuse, as on a node image without the package; no zstd, as with squashfs tools built before it.
    squashfuse: bool | None = None
    zstd: bool | None = None
    # Whether the compute nodes enforce each job's CPUs, memory and GPU devices with cgroups (None: where
    # the engine can give them cgroups of their own, cgroup v1 and not rootless; lifecycle.cgroups_for).
    cgroups: bool | None = None

    def __post_init__(self) -> None:
        check_name(self.name)
        if self.runtime not in (None, *RUNTIMES):
            raise HpcboxError(
                f"runtime: {self.runtime!r} is not one of {', '.join(RUNTIMES)}",
                "use --runtime=apptainer or --runtime=singularity",
            )
        if not 1 <= self.nodes <= MAX_NODES:
            raise HpcboxError(
                f"nodes: {self.nodes} is out of range", f"choose 1 to {MAX_NODES} compute nodes"
            )
        if not 1024 <= self.port <= 65535:
            raise HpcboxError(f"port: {self.port} is out of range", "choose an unprivileged port, 1024-65535")
        versions.check(self.slurm)
        object.__setattr__(self, "added_gpu_types", tuple(self.added_gpu_types))  # a list, read back
        for gpu_type in self.added_gpu_types:
            if not _GPU_TYPE.match(gpu_type):
                raise HpcboxError(f"added_gpu_types: {gpu_type!r} is not a Slurm GPU type name")
        for field in ("gpus_per_node", "cpus_per_node", "memory_mb_per_node"):
            if getattr(self, field) < 1:
                raise HpcboxError(f"{field}: must be at least 1, got {getattr(self, field)}")

    @property
    def software(self) -> dict[str, str | bool | None]:
        """The node software asked for, by ClusterShape field (None: as the profile has it)."""
        return {"runtime": self.runtime, "fuse": self.fuse, "squashfuse": self.squashfuse, "zstd": self.zstd}

    @property
    def up_command(self) -> str:
        """The `hpcbox cluster.up` that asks for exactly this cluster (one made through its flags): those
        that are not defaults, and --nodes for a cluster shaped like a site (whose default is its own)."""
        flags = []
        for name in ("name", "like", "nodes", "port", "slurm", *self.software):
            value = getattr(self, name)
            if value is None or (
                value == CLUSTER_SPEC_DEFAULTS[name] and (name != "nodes" or self.like == "local")
            ):
                continue
            flags.append(f"--{name}={('yes' if value else 'no') if isinstance(value, bool) else value}")
        return shlex.join(["hpcbox", "cluster.up", *flags])

    @property
    def slurm_name(self) -> str:
        # Slurm names accounting tables after the cluster; keep it to [a-z0-9_].
        return self.name.replace("-", "_")

    @property
    def compute_hosts(self) -> tuple[str, ...]:
        return tuple(f"node{index}" for index in range(1, self.nodes + 1))

    @property
    def hosts(self) -> tuple[str, ...]:
        """Every host in start order: accounting first, the login node last."""
        return ("accounting", "controller", *self.compute_hosts, "login")

    def container(self, host: str) -> str:
        return f"{self.name}-{host}"

    @property
    def network(self) -> str:
        return f"{self.name}-net"

    @property
    def home_volume(self) -> str:
        return f"{self.name}-home"

    @property
    def data_volume(self) -> str:
        return f"{self.name}-data"


CLUSTER_SPEC_DEFAULTS = {field.name: field.default for field in fields(ClusterSpec)}


def spec_like(profile: str, nodes: int | None = None, **settings: Any) -> ClusterSpec:
    """A cluster shaped like ``profile``; a site's gets the rehearsal node sizes unless ``settings`` say,
    and ``nodes`` defaults to DEFAULT_NODES, or one per GPU layout of its partitions where it has more."""
    from hpcbox.minicluster.shape import shape_like

    sizes = {}
    if profile != "local":
        sizes = {"cpus_per_node": REHEARSAL_CPUS_PER_NODE, "memory_mb_per_node": REHEARSAL_MEMORY_MB_PER_NODE}
    if nodes is None:
        nodes = max(DEFAULT_NODES, len(shape_like(profile).node_groups))
    return ClusterSpec(like=profile, nodes=nodes, **{**sizes, **settings})


def role(host: str) -> str:
    """The hpcbox-node role a host runs."""
    return "compute" if host.startswith("node") else host


def check_name(name: str) -> str:
    """``name`` if it is a cluster name: the commands that only look a cluster up (status, shell, down)
    check it too, since it becomes a folder under the state root that `down` removes."""
    if not _NAME.match(name):
        raise HpcboxError(
            f"name: {name!r} is not a valid cluster name",
            "use 3-40 lowercase letters, digits and dashes, starting with a letter",
        )
    return name


def state_root(environ: Mapping[str, str] = os.environ) -> Path:
    """Where this user's mini clusters keep their keys and config, one folder for every project on the
    machine (a cluster is the user's, not a checkout's): HPCBOX_MINICLUSTER_STATE, else
    ``$XDG_STATE_HOME/hpcbox/cluster``, else ``~/.local/state/hpcbox/cluster``."""
    override = environ.get(STATE_VARIABLE)
    if override:
        return Path(override).expanduser()
    # The XDG base directory spec: a relative path in the variable is invalid and to be ignored.
    xdg = environ.get("XDG_STATE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "state"
    return base / "hpcbox" / "cluster"


def state_dir(root: Path, name: str) -> Path:
    """Where ``up`` keeps a cluster's generated keys and config: ``<root>/<name>`` (folder mode 0700)."""
    return root / check_name(name)


def legacy_state_dir(project_state: Path, name: str) -> Path:
    """Where hpcbox kept a cluster's keys before they moved to the user's state folder: in the checkout
    that brought it up (``<project>/.hpcbox/cluster/<name>``). Adopted from there once (state.py)."""
    return project_state / "cluster" / check_name(name)
