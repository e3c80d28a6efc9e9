"""Cluster profiles: each site's scheduler conventions, read from TOML and validated once at load time.

Profiles ship beside this module, in `clusters/<name>.toml`; users add or override their own in
`~/.config/hpcbox/clusters/` (or the directory named by `$HPCBOX_CLUSTERS_DIR`). A profile states what
is publicly known about a site; whatever is not known is listed under `unknown` in the file, and
hpcbox then neither validates against it nor renders it. A setting hpcbox needs a value for, which the
site does not publish, is given a generic one and named under `assumed` (`"storage.node_scratch"`):
job scripts and rehearsals say so, for the user to check at the site.

Most sites run Slurm; an LSF site (`scheduler = "lsf"`) lists `[[queues]]` where a Slurm one lists
`[[partitions]]`, both read into `Partition`, and leaves out what LSF has no word for (QOS, GPU types
in the request, MIG slices).
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcbox.errors import FieldError
from hpcbox.files import project_root
from hpcbox.sif.compression import DEFAULT as DEFAULT_COMPRESSION
from hpcbox.sif.compression import SifCompression, parse_compression
from hpcbox.tables import Table, load_toml
from hpcbox.units import parse_time

# The shipped profiles, one per site, beside this file.
SHIPPED_DIR = Path(__file__).resolve().parent / "clusters"
PROJECT_DIR = "slurm/clusters"

SCHEDULERS = ("slurm", "lsf")
# How each scheduler's sites ask for GPUs: Slurm's --gres or --gpus-per-node, LSF's bsub -gpu.
GPU_REQUEST_STYLES = {"slurm": ("gres", "gpus-per-node"), "lsf": ("gpu",)}
# What a profile calls the places jobs are submitted to.
PLACE_TABLES = {"slurm": "partitions", "lsf": "queues"}
APPTAINER_COMMANDS = ("apptainer", "singularity")
# Paths inside the container that hpcbox binds itself (job scratch and the code snapshot).
RESERVED_CONTAINER_PATHS = ("/scratch", "/code")

_ENV_VAR = re.compile(r"^\$[A-Za-z_][A-Za-z0-9_]*$")
_PARTITION_FACTS = ("max_time", "gpus_per_node", "gpu_types", "cpus_per_gpu")
# A site's Slurm, as its release (23.02) or as `sinfo --version` prints it (23.02.7).
_SLURM_VERSION = re.compile(r"^\d{2}\.\d{2}(\.\d+)?$")
# A group's name as groupadd and the sites' directories take it: a letter or '_' first (a number is a
# gid, not a name), then letters, digits, '.', '_' or '-' (a Samba machine group's '$' at its end).
_GROUP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9._-]{0,255}\$?$")


@dataclass(frozen=True)
class Partition:
    """A Slurm partition, or an LSF queue: where a job is submitted, with its published limits."""

    name: str
    max_time_s: int | None = None  # None: no limit, or none published (then not checked)
    gpus_per_node: int | None = None
    gpu_types: tuple[str, ...] | None = None
    cpus_per_gpu: int | None = None
    default_gpu_type: str | None = None
    qos: str | None = None  # a QOS this partition requires (e.g. M3's desktop -> desktopq)
    preemptible: bool = False
    # The scheduler routes jobs to partitions itself (the Alliance): no --partition line is written.
    implicit: bool = False
    default: bool = False


@dataclass(frozen=True)
class Login:
    host: str
    port: int = 22
    user: str | None = None


@dataclass(frozen=True)
class StoreSettings:
    """`[store]`: who besides the user may read what hpcbox keeps on the cluster (hpcbox.store)."""

    group: str | None = None  # the group that may read it, read only; None: the user alone


@dataclass(frozen=True)
class Apptainer:
    command: str = "apptainer"
    setup: tuple[str, ...] = ()  # shell lines that make the command available (module loads)
    options: tuple[str, ...] = ()  # extra `exec` options, e.g. --containall
    workdir_on_scratch: bool = False  # --workdir under the job's node scratch (Alliance: -W $SLURM_TMPDIR)
    # Each node copies the SIF to its scratch before the job runs it: for sites whose shared file system
    # is slow to serve an image to many processes. A job's own sif_on_scratch wins.
    sif_on_scratch: bool = False
    # Whether the compute nodes can mount a SIF for an unprivileged Apptainer (FUSE and squashfuse, or a
    # setuid install); None: not known, and each job finds out on its nodes (render/sbatch.py). Where
    # they cannot, each node runs the SIF unpacked to a sandbox on its scratch.
    fuse: bool | None = None
    binds: tuple[str, ...] = ()  # site areas to bind: "/project" or "/src:/dst"
    # What the site's Apptainer/Singularity reads: zstd only where that is known (checked on the mini
    # cluster for `local`), else a fast gzip every release reads.
    compression: SifCompression = DEFAULT_COMPRESSION

    @property
    def loads_modules(self) -> bool:
        """Whether the setup loads environment modules (the site's `module` command must be there)."""
        return any(line.split()[:1] == ["module"] for line in self.setup)


@dataclass(frozen=True)
class Preemption:
    """`[preemption]`: what the site does to a job in a preemptible partition once it is picked, as far
    as the profile knows (None: not known; a rehearsal then gives a generic value and says so)."""

    # Slurm's PreemptParameters=send_user_signal: the job's own --signal goes to it at once, before the
    # TERM of every preemption (Slurm's default: no).
    send_user_signal: bool | None = None
    # The partition's GraceTime: seconds between the TERM and the KILL.
    grace_time_s: int | None = None


@dataclass(frozen=True)
class ClusterProfile:
    name: str
    description: str
    login: Login
    partitions: tuple[Partition, ...]
    gpu_request: str = "gres"
    gpu_type_required: bool = False
    max_mig_slices: int | None = None  # MIG slices one job may ask for (None: no limit published)
    account_required: bool = False
    account_hint: str = ""
    # The site's accounts where the profile lists them (a group's own copy); None: not known, and any
    # account name is taken (the rehearsal adds it to its accounting).
    accounts: tuple[str, ...] | None = None
    qos_required: bool = False
    node_scratch: str = "/tmp"  # an absolute path on each node, or "$VARIABLE" set per job
    shared: dict[str, str] = field(default_factory=dict)  # home / project / scratch areas, for people
    compute_internet: bool | None = None
    apptainer: Apptainer = field(default_factory=Apptainer)
    prelude: str = ""
    source: Path | None = None
    scheduler: str = "slurm"
    # The site's Slurm version (`[slurm] version`); None: not known. A rehearsal runs the nearest one.
    slurm_version: str | None = None
    # Settings given a generic value, not the site's published one: ("storage.node_scratch", '"/tmp"').
    assumed: tuple[tuple[str, str], ...] = ()
    store: StoreSettings = field(default_factory=StoreSettings)
    preemption: Preemption = field(default_factory=Preemption)

    @property
    def lsf(self) -> bool:
        return self.scheduler == "lsf"

    @property
    def place(self) -> str:
        """What the site calls a partition: "queue" on LSF."""
        return "queue" if self.lsf else "partition"

    @property
    def default_partition(self) -> Partition:
        for partition in self.partitions:
            if partition.default:
                return partition
        return self.partitions[0]

    def partition(self, name: str | None) -> Partition:
        if name is None:
            return self.default_partition
        for partition in self.partitions:
            if partition.name == name:
                return partition
        allowed = ", ".join(p.name for p in self.partitions)
        raise FieldError(
            "partition",
            f"{name!r} is not a {self.place} of cluster {self.name!r} (allowed: {allowed})",
            f"pick one of them, or add it to {self.editable_source()}",
        )

    def editable_source(self) -> str:
        """Where to change this profile: its own file, unless that is one hpcbox ships (an upgrade would
        replace it), which is copied to the user's profiles first, where it shadows the shipped one."""
        if self.source is None:
            return "the profile"
        if self.source.parent != SHIPPED_DIR:
            return str(self.source)
        return f"a copy of {self.source} in {profile_dirs()[0]}/ (a profile there shadows the shipped one)"

    @property
    def node_scratch_variable(self) -> str | None:
        """The environment variable naming node scratch, when the site sets one per job."""
        return self.node_scratch[1:] if self.node_scratch.startswith("$") else None


def profile_dirs() -> list[Path]:
    """Where profiles are looked up, first match wins: the user's directory, the project's own
    slurm/clusters/ (a profile a group keeps with its code), then the shipped ones."""
    user_dir = os.environ.get("HPCBOX_CLUSTERS_DIR")
    if user_dir:
        first = Path(user_dir).expanduser()
    else:
        config_home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
        first = config_home / "hpcbox" / "clusters"
    root = project_root()
    project = [root / PROJECT_DIR] if root and (root / PROJECT_DIR).is_dir() else []
    return [first, *project, SHIPPED_DIR]


def available() -> dict[str, Path]:
    """Every profile name with the file that defines it (user files shadow shipped ones)."""
    found: dict[str, Path] = {}
    for directory in profile_dirs():
        if directory.is_dir():
            for path in sorted(directory.glob("*.toml")):
                found.setdefault(path.stem, path)
    return found


def load_profile(name: str | None) -> ClusterProfile:
    profiles = available()
    allowed = ", ".join(sorted(profiles)) or "none found"
    if not name:
        raise FieldError("cluster", f"no cluster given (allowed: {allowed})", "pass --cluster=NAME")
    if name not in profiles:
        raise FieldError(
            "cluster",
            f"no profile named {name!r} (allowed: {allowed})",
            f"add {name}.toml to {profile_dirs()[0]}",
        )
    return parse_profile_file(profiles[name])


def parse_profile_file(path: Path) -> ClusterProfile:
    data = load_toml(path)
    try:
        return parse_profile(data, name=path.stem, source=path)
    except FieldError as exc:
        raise FieldError(exc.field, f"{exc.message.split(': ', 1)[1]} (in {path})", exc.hint) from exc


def parse_profile(data: dict[str, Any], *, name: str, source: Path | None = None) -> ClusterProfile:
    reader = Table(data, "")
    unknown = set(reader.str_list("unknown", default=[]))
    scheduler = reader.choice("scheduler", SCHEDULERS, default="slurm")
    login_table = reader.table("login")
    login = Login(
        host=check_login_word(login_table.key("host"), login_table.string("host")),
        port=login_table.integer("port", default=22, minimum=1),
        user=check_login_word(login_table.key("user"), login_table.optional_string("user")),
    )
    login_table.reject_extra(what="profile setting")
    store_table = reader.table("store", required=False)
    store = StoreSettings(group=check_group(store_table.key("group"), store_table.optional_string("group")))
    store_table.reject_extra(what="profile setting")
    gpus = reader.table("gpus")
    accounting = reader.table("accounting", required=False)
    storage = reader.table("storage")
    node_scratch = storage.string("node_scratch")
    if not (node_scratch.startswith("/") or _ENV_VAR.match(node_scratch)):
        raise FieldError(
            "storage.node_scratch", f"{node_scratch!r} is neither an absolute path nor $VARIABLE"
        )
    shared = {key: storage.string(key) for key in ("home", "project", "scratch") if key in storage.data}
    apptainer_table = reader.table("apptainer", required=False)
    apptainer = Apptainer(
        command=apptainer_table.choice("command", APPTAINER_COMMANDS, default="apptainer"),
        setup=tuple(apptainer_table.str_list("setup", default=[])),
        options=tuple(apptainer_table.str_list("options", default=[])),
        workdir_on_scratch=apptainer_table.boolean("workdir_on_scratch", default=False),
        sif_on_scratch=apptainer_table.boolean("sif_on_scratch", default=False),
        fuse=apptainer_table.get("fuse", bool, required=False),
        binds=tuple(
            check_bind(f"{apptainer_table.where}.binds", item)
            for item in apptainer_table.str_list("binds", default=[])
        ),
        compression=_compression(apptainer_table),
    )
    apptainer_table.reject_extra(what="profile setting")
    places = PLACE_TABLES[scheduler]
    for other in set(PLACE_TABLES.values()) - {places}:
        if other in reader.data:
            raise FieldError(
                other, f"a profile with scheduler = {scheduler!r} lists [[{places}]], not [[{other}]]"
            )
    partitions = tuple(_partition(table) for table in reader.tables(places))
    if not partitions:
        raise FieldError(places, f"a profile needs at least one [[{places}]] table")
    names = [p.name for p in partitions]
    if len(set(names)) != len(names):
        raise FieldError(places, f"names repeat: {names}")
    if sum(p.default for p in partitions) > 1:
        raise FieldError(places, "more than one is marked default = true")
    storage.reject_extra(what="profile setting")
    slurm = reader.table("slurm", required=False)
    slurm_version = slurm.optional_string("version")
    if slurm_version is not None and not _SLURM_VERSION.match(slurm_version):
        raise FieldError(
            slurm.key("version"),
            f"{slurm_version!r} is not a Slurm version such as 23.02 or 23.02.7",
            "copy it from `sinfo --version` on the site's login node",
        )
    slurm.reject_extra(what="profile setting")
    preemption_table = reader.table("preemption", required=False)
    preemption = Preemption(
        send_user_signal=preemption_table.get("send_user_signal", bool),
        grace_time_s=preemption_table.integer("grace_time_s", minimum=0)
        if "grace_time_s" in preemption_table
        else None,
    )
    preemption_table.reject_extra(what="profile setting")
    compute_internet = None if "compute_internet" in unknown else reader.boolean("compute_internet")
    profile = ClusterProfile(
        name=name,
        description=reader.optional_string("description") or "",
        login=login,
        partitions=partitions,
        gpu_request=gpus.choice("request", GPU_REQUEST_STYLES[scheduler]),
        gpu_type_required=gpus.boolean("type_required", default=False),
        max_mig_slices=gpus.integer("max_mig_slices", minimum=1) if "max_mig_slices" in gpus.data else None,
        account_required=accounting.boolean("account_required", default=False),
        account_hint=accounting.optional_string("account_hint") or "",
        accounts=tuple(accounting.str_list("accounts")) if "accounts" in accounting.data else None,
        qos_required=accounting.boolean("qos_required", default=False),
        node_scratch=node_scratch,
        shared=shared,
        compute_internet=compute_internet,
        apptainer=apptainer,
        prelude=reader.optional_string("prelude") or "",
        source=source,
        scheduler=scheduler,
        slurm_version=slurm_version,
        assumed=_assumed(reader, data),
        store=store,
        preemption=preemption,
    )
    for table in (reader, gpus, accounting):
        table.reject_extra(what="profile setting")
    for index, partition in enumerate(partitions):
        if partition.default_gpu_type and not profile.gpu_type_required:
            # A site that takes untyped requests gets them: a default type would narrow every job.
            raise FieldError(
                f"{places}[{index}].default_gpu_type",
                "is only for sites that need a GPU type (gpus.type_required = true); here a request "
                "without one stays untyped",
            )
    if profile.lsf:
        _check_lsf(profile)
    return profile


def _assumed(reader: Table, data: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The settings ``assumed`` names, each with its value as the file gives it."""
    assumed = []
    for key in reader.str_list("assumed", default=[]):
        table, _, setting = key.partition(".")
        value = data.get(table, {}).get(setting) if isinstance(data.get(table), dict) else None
        if value is None:
            raise FieldError(
                "assumed",
                f"{key!r} is not a setting this profile gives",
                "name one as table.key, e.g. storage.node_scratch, and give it its generic value",
            )
        assumed.append((key, json.dumps(value)))
    return tuple(assumed)


def assumptions(profile: ClusterProfile) -> str:
    """One line naming what ``profile`` assumes of its site, or "" where it assumes nothing."""
    if not profile.assumed:
        return ""
    settings = "; ".join(f"{key} = {value}" for key, value in profile.assumed)
    return f"assumed for {profile.name}, not published by the site (check them there): {settings}"


def _check_lsf(profile: ClusterProfile) -> None:
    """Slurm's words that an LSF profile cannot use: the job script would have no line for them."""
    slurm_only = {
        "gpus.type_required": (profile.gpu_type_required, "the queue decides the GPU model on LSF"),
        "gpus.max_mig_slices": (profile.max_mig_slices is not None, "no MIG slice request is rendered"),
        "accounting.qos_required": (profile.qos_required, "LSF has no QOS"),
        "slurm.version": (profile.slurm_version is not None, "the site runs LSF, not Slurm"),
        "preemption": (profile.preemption != Preemption(), "these are Slurm's preemption settings"),
    }
    for index, partition in enumerate(profile.partitions):
        slurm_only[f"queues[{index}].qos"] = (partition.qos is not None, "LSF has no QOS")
    for field_name, (given, why) in slurm_only.items():
        if given:
            raise FieldError(field_name, f"is a Slurm setting: {why} (leave it out of an LSF profile)")


def _partition(table: Table) -> Partition:
    unknown = set(table.str_list("unknown", default=[]))
    for fact in _PARTITION_FACTS:
        given = fact in table.data
        if given == (fact in unknown):
            state = "both given and listed" if given else "neither given nor listed"
            raise FieldError(f"{table.where}.{fact}", f"{state} in `unknown`; say what is known, once")
    max_time = table.optional_string("max_time")
    if max_time and max_time.upper() in ("INFINITE", "UNLIMITED"):
        max_time = None
    types = table.str_list("gpu_types", default=[]) if "gpu_types" in table.data else None
    partition = Partition(
        name=table.name("name"),
        max_time_s=parse_time(max_time, f"{table.where}.max_time") if max_time else None,
        gpus_per_node=table.integer("gpus_per_node", minimum=0) if "gpus_per_node" in table.data else None,
        gpu_types=tuple(types) if types is not None else None,
        cpus_per_gpu=table.integer("cpus_per_gpu", minimum=1) if "cpus_per_gpu" in table.data else None,
        default_gpu_type=table.optional_string("default_gpu_type"),
        qos=table.optional_string("qos"),
        preemptible=table.boolean("preemptible", default=False),
        implicit=table.boolean("implicit", default=False),
        default=table.boolean("default", default=False),
    )
    types = partition.gpu_types
    if partition.default_gpu_type and types is not None and partition.default_gpu_type not in types:
        raise FieldError(f"{table.where}.default_gpu_type", "is not one of the partition's gpu_types")
    table.reject_extra({"unknown", "notes"}, what="profile setting")
    return partition


def check_login_word(field_name: str, value: str | None) -> str | None:
    """A login host or user as ssh and rsync take it: one word, never one that would read as an option."""
    if value is None:
        return None
    if value.startswith("-"):
        what = field_name.rsplit(".", 1)[-1]
        raise FieldError(
            field_name,
            f"{value!r} begins with '-', which ssh would read as an option, not a {what}",
            "give the login node's name (or a ~/.ssh/config alias) and put ssh options in ~/.ssh/config",
        )
    if any(char.isspace() or unicodedata.category(char) == "Cc" for char in value):
        raise FieldError(field_name, f"{value!r} contains spaces or control characters")
    return value


def check_group(field_name: str, value: str | None) -> str | None:
    """A group's name, as `chgrp` takes it (see _GROUP_NAME)."""
    if value is not None and not _GROUP_NAME.match(value):
        raise FieldError(
            field_name,
            f"{value!r} is not a group name: a letter or '_' first, then letters, digits, '.', '_' or '-'",
            "give the group's name as `id -Gn` on the login node prints it",
        )
    return value


def check_bind(field_name: str, spec: str) -> str:
    """An Apptainer --bind spec, /host or /host:/container[:ro|rw], that leaves hpcbox's own mounts be."""
    source, _, rest = spec.partition(":")
    target, _, options = rest.partition(":")
    target = target or source
    problem = ""
    if not source.startswith("/") or not target.startswith("/"):
        problem = "use absolute paths, /host or /host:/container"
    elif options not in ("", "ro", "rw"):
        problem = f"{options!r} is not a bind option (allowed: ro, rw)"
    elif "," in spec or any(unicodedata.category(char) in ("Cc", "Zl", "Zp") for char in spec):
        problem = "contains ',' (Apptainer splits binds there) or control characters"
    elif target.rstrip("/") in RESERVED_CONTAINER_PATHS:
        raise FieldError(
            field_name,
            f"{spec!r}: {target} is where hpcbox binds the job's scratch or code",
            "bind it elsewhere, e.g. /scratch:/cluster/scratch",
        )
    if problem:
        raise FieldError(field_name, f"{spec!r}: {problem}")
    return spec


def bind_target(spec: str) -> str:
    """Where a --bind spec appears in the container."""
    source, _, rest = spec.partition(":")
    return (rest.partition(":")[0] or source).rstrip("/") or "/"


def _compression(apptainer: Table) -> SifCompression:
    value = apptainer.optional_string("compression")
    return DEFAULT_COMPRESSION if value is None else parse_compression(value, apptainer.key("compression"))
