"""The shape of a mini cluster: the Slurm a cluster profile describes, as far as the profile knows it.

`hpcbox cluster.up --like edi` brings up a mini cluster configured from the `edi` profile: its
partitions with their time limits and default, GPU gres with the profile's types (a partition whose
profile lists its types has nodes of its own with those alone, as at the site), the account and QOS
rules as Slurm itself enforces them (associations in slurmdbd, a job_submit filter where the profile
states that an account is required; a rule it only assumes refuses nothing, and a job without an
account is charged to the user's default one), node scratch at the site's path (or in the variable the
site sets per job), the site's shared areas and its Apptainer command. What the profile does not know
gets a generic value, and `generic` says which, so that `cluster.status` can say what the rehearsal
does not check.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hpcbox.errors import FieldError
from hpcbox.minicluster import versions
from hpcbox.render.profiles import ClusterProfile, assumptions, load_profile

# Where node scratch lives when the site names it only by a variable set per job (the Alliance's and
# Mila's $SLURM_TMPDIR): the Alliance's own layout, <dir>/<user>.<job id>.0, made by the prolog.
VARIABLE_SCRATCH_DIR = "/localscratch"
# Site areas (/project, /scratch ...) live on the shared data volume under this folder, linked from
# their site path on every node.
SITE_AREAS_DIR = "/data/site"
_PLAIN_PATH = re.compile(r"^/[A-Za-z0-9._/-]+$")
_AREA_VARIABLE = re.compile(r"^\$([A-Z][A-Z0-9_]*)$")
_SET_BY_LOGIN = ("HOME", "USER")  # every node's login sets these already
# The site rules a rehearsal's filter enforces (ClusterProfile attributes), each by its `assumed` key.
RULES = {
    "accounting.account_required": "account_required",
    "accounting.qos_required": "qos_required",
    "gpus.type_required": "gpu_type_required",
}
# A preempted job's seconds between TERM and KILL where the profile does not say (Slurm's own default, 0,
# would give a job no time to checkpoint): KillWait's 30 s, which a time limit gives.
GENERIC_GRACE_TIME_S = 30
# How the compute nodes hold a job to its request (ClusterShape.cgroups), as `cluster.status` says it.
ENFORCEMENT = {
    True: "CPUs, memory and GPU devices by cgroups (cgroup v{version}), as at a cgroup site (over --mem: "
    "OUT_OF_MEMORY at once; a job opens only its own GPUs)",
    False: "CPUs by binding, memory by Slurm's accounting (over --mem: killed within a second, FAILED "
    "0:9; OUT_OF_MEMORY at a cgroup site); GPUs only by CUDA_VISIBLE_DEVICES (no cgroups on this engine)",
}


@dataclass(frozen=True)
class ShapedPartition:
    name: str
    max_time_minutes: int | None  # None: INFINITE (no limit, or none published)
    default: bool
    qos: str | None  # the only QOS the partition allows (M3's desktop: desktopq)
    # The GPU types its profile lists for it (() untyped); None: not known, so its nodes have every type
    # the shape has (ClusterShape.gpu_types).
    gpu_types: tuple[str, ...] | None = None
    # Its jobs are preempted by those of the other partitions on its nodes (a lower PriorityTier).
    preemptible: bool = False


@dataclass(frozen=True)
class ClusterShape:
    profile: str
    partitions: tuple[ShapedPartition, ...]
    # Every GPU type the profile names, and those rehearsal jobs added: the nodes of partitions whose
    # types are not known have each of them (empty: untyped gres, gpu:N).
    gpu_types: tuple[str, ...]
    gpus_per_type: int
    # The rules the filter enforces: those the profile states as the site's, not those it only assumes.
    account_required: bool
    qos_required: bool
    scratch_dir: str  # the node-local folder, made on every compute node
    scratch_variable: str | None  # set per job to a folder under scratch_dir (e.g. SLURM_TMPDIR)
    site_areas: tuple[str, ...]  # shared site paths made on every node, e.g. /project
    module_stub: bool  # the profile's setup loads environment modules, which the nodes do not have
    generic: tuple[str, ...]  # facts the profile leaves unknown, filled with generic values
    # The container runtime on the compute nodes' PATH: "apptainer" (with its `singularity` alias) or
    # "singularity" alone, as at a site with SingularityCE (not in Debian: Apptainer's alias stands in).
    runtime: str = "apptainer"
    fuse: bool = True  # whether users' Apptainer can mount a SIF (FUSE); else jobs unpack it
    squashfuse: bool = True  # squashfuse installed (Apptainer mounts a SIF with it, given FUSE)
    zstd: bool = True  # squashfuse reads zstd (older builds do not)
    assumed: str = ""  # what the profile assumes of its site, in a line (profiles.assumptions)
    # Site areas named by a variable the site sets at login (Mila's $SCRATCH): a folder on the shared
    # data volume each, exported under that name by every node's login shell.
    area_variables: tuple[str, ...] = ()
    # A job asking for GPUs must name their type: the site's filter refuses `--gres=gpu:N`.
    gpu_type_required: bool = False
    # The site rules the profile only assumes (its `assumed` keys in RULES): the rehearsal refuses no job
    # for them, since the site may not; one without an account goes to the user's default account.
    assumed_rules: tuple[str, ...] = ()
    # The compute nodes hold each job to its CPUs, memory and GPU devices with cgroups, as most sites
    # do (a job over --mem ends OUT_OF_MEMORY, a job opens only its own GPUs); False where the engine
    # gives the nodes no cgroups of their own: Slurm's accounting kills it (FAILED 0:9) within a second
    # (slurmconf.enforcement). Not the profile's to say: `up` sets it from the engine (lifecycle).
    cgroups: bool = True
    # The engine's cgroup version, 1 or 2: which of Slurm's cgroup plugins the nodes run, and how
    # hpcbox-node hands slurmd its tree. Set by `up` from the engine, as ``cgroups`` is.
    cgroup_version: int = 1
    # What a preempted job of a preemptible partition meets: its --signal first (send_user_signal) or
    # TERM alone, and the seconds between that TERM and the KILL before it is requeued.
    send_user_signal: bool = False
    grace_time_s: int = GENERIC_GRACE_TIME_S

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> ClusterShape:
        """The shape `dataclasses.asdict` saved (in the cluster's state, read back by `find`)."""
        fields = {key: tuple(value) if isinstance(value, list) else value for key, value in saved.items()}
        fields["partitions"] = tuple(
            ShapedPartition(
                **{**p, "gpu_types": None if p.get("gpu_types") is None else tuple(p["gpu_types"])}
            )
            for p in saved["partitions"]
        )
        return cls(**fields)

    @property
    def node_groups(self) -> tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]:
        """(GPU types, partition names) of each group of nodes that share a GPU layout: a partition
        with its own known types gets nodes with those alone; partitions whose types are not known share
        nodes with every type the shape has."""
        groups: dict[tuple[str, ...], list[str]] = {}
        for partition in self.partitions:
            types = self.gpu_types if partition.gpu_types is None else partition.gpu_types
            groups.setdefault(types, []).append(partition.name)
        return tuple((types, tuple(names)) for types, names in groups.items())

    @property
    def gpus_per_node(self) -> int:
        """The most GPUs a node of this shape has (each node has the fake devices for that many)."""
        return max(self.gpus_per_type * max(1, len(types)) for types, _ in self.node_groups)

    def with_gpu_types(self, added: Sequence[str]) -> ClusterShape:
        """This shape with GPUs of the ``added`` types too, as many of each per node as of its own.
        Untyped gres becomes typed: an untyped request still takes a GPU of any type."""
        new = tuple(gpu_type for gpu_type in dict.fromkeys(added) if gpu_type not in self.gpu_types)
        return dataclasses.replace(self, gpu_types=self.gpu_types + new) if new else self

    def with_software(self, **asked: str | bool | None) -> ClusterShape:
        """This shape with the node software `cluster.up` asks for (runtime, fuse, squashfuse, zstd;
        None: as it is)."""
        return dataclasses.replace(
            self, **{name: value for name, value in asked.items() if value is not None}
        )

    @property
    def lacking(self) -> tuple[str, ...]:
        """What of the nodes' squashfs tools this cluster leaves out: squashfuse, its zstd."""
        return tuple(what for what in ("squashfuse", "zstd") if not getattr(self, what))

    @property
    def enforces_associations(self) -> bool:
        """Slurm refuses jobs whose account or QOS it does not know (AccountingStorageEnforce): where
        the site charges jobs to accounts (an account rule, stated or assumed) or limits QOS."""
        return (
            self.filters_submissions or bool(self.qos) or "accounting.account_required" in self.assumed_rules
        )

    @property
    def filters_submissions(self) -> bool:
        """A job_submit.lua filter refuses jobs without the account (or QOS) the site requires."""
        return self.account_required or self.qos_required or self.gpu_type_required

    @property
    def preempts(self) -> bool:
        """Jobs of some partition are preempted by the others' (PreemptType=preempt/partition_prio)."""
        return any(p.preemptible for p in self.partitions)

    @property
    def qos(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.qos for p in self.partitions if p.qos))

    def describe(self) -> list[str]:
        """What this mini cluster takes from its profile, and what it fills in, for people."""

        def partition(p: ShapedPartition) -> str:
            limit = f"MaxTime {p.max_time_minutes} min" if p.max_time_minutes else "no time limit known"
            extras = [limit, *(["default"] if p.default else []), *([f"QOS {p.qos} only"] if p.qos else [])]
            return f"{p.name} ({', '.join(extras)})"

        def layout(types: tuple[str, ...]) -> str:
            if types:
                return f"typed gres, {self.gpus_per_type} of each type per node: {', '.join(types)}"
            return f"untyped gres, {self.gpus_per_type} per node"

        groups = self.node_groups
        gpus = (
            layout(groups[0][0])
            if len(groups) == 1
            else "nodes of their own for "
            + "; ".join(f"{', '.join(names)}: {layout(types)}" for types, names in groups)
        )
        scratch = (
            f"${self.scratch_variable} (a folder under {self.scratch_dir} per job)"
            if self.scratch_variable
            else self.scratch_dir
        )
        account = "required (a job without --account is refused)" if self.account_required else "default"
        if "accounting.account_required" in self.assumed_rules:
            account = "your default one where a job names none (the profile only assumes one is required)"
        if self.gpu_type_required:
            gpus += "; a GPU type required (a job asking for GPUs without one is refused)"
        elif "gpus.type_required" in self.assumed_rules:
            gpus += "; a GPU request without a type takes any (the profile only assumes one is required)"
        lines = [
            f"shaped like profile {self.profile!r}",
            f"  partitions: {'; '.join(partition(p) for p in self.partitions)}",
            f"  GPUs: {gpus}",
            f"  account: {account}",
            f"  node scratch: {scratch}",
        ]
        if self.preempts:
            first = (
                "its --signal at once, then TERM"
                if self.send_user_signal
                else "TERM (not its --signal: no send_user_signal)"
            )
            preemptible = ", ".join(p.name for p in self.partitions if p.preemptible)
            lines.append(
                f"  preemption: {preemptible} preempted by the other partitions' jobs on its nodes; a "
                f"preempted job gets {first}, KILL {self.grace_time_s} s later, and is requeued"
            )
        if self.site_areas or self.area_variables:
            named = [f"${name} ({SITE_AREAS_DIR}/{name})" for name in self.area_variables]
            lines.append(f"  site areas: {', '.join([*self.site_areas, *named])}")
        runtime = (
            "apptainer (and its `singularity` alias)"
            if self.runtime == "apptainer"
            else "singularity only (Apptainer's own alias: SingularityCE is not in Debian)"
        )
        fuse = "yes" if self.fuse else "no: a job unpacks the SIF to node scratch"
        lines.append(f"  container runtime: {runtime}; FUSE for users: {fuse}")
        lines.append(f"  enforced: {ENFORCEMENT[self.cgroups].format(version=self.cgroup_version)}")
        if self.lacking:
            lines.append(f"  squashfs tools: no {' and no '.join(self.lacking)}")
        if self.module_stub:
            lines.append("  `module` is a stub that loads nothing: apptainer is on PATH")
        if self.generic:
            lines.append(f"  not known for {self.profile}, generic here: {'; '.join(self.generic)}")
        if self.assumed:
            lines.append(f"  {self.assumed}")
        return lines


def shape_like(name: str, gpus_per_node: int = 2) -> ClusterShape:
    """The shape of profile ``name`` (`cluster.up --like NAME`), with errors naming `like`."""
    profile = _profile_like(name)
    if profile.scheduler != "slurm":
        raise FieldError(
            "like",
            f"{name} uses {profile.scheduler.upper()}, and the mini cluster runs Slurm",
            "rehearse a Slurm profile; `hpcbox sbatch --cluster " + name + "` renders its script",
        )
    return shape_of(profile, gpus_per_node)


def slurm_like(name: str, asked: str | None = None, *, say: Callable[[str], None] = print) -> str:
    """The Slurm version a mini cluster shaped like profile ``name`` runs: ``asked`` (`--slurm`), else
    the nearest the mini cluster has to the version the profile names, else the default; where that is
    not the site's own release, ``say`` gets one line saying so."""
    if asked is not None:
        versions.check(asked)  # before the profile is read: a bad flag is the error, whatever the profile
    site = _profile_like(name).slurm_version
    running = versions.for_site(site, asked)
    if line := versions.note(name, site, running):
        say(line)
    return running


def _profile_like(name: str) -> ClusterProfile:
    try:
        return load_profile(name)
    except FieldError as exc:
        raise FieldError("like", exc.message.split(": ", 1)[1], exc.hint) from exc


def shape_of(profile: ClusterProfile, gpus_per_node: int = 2) -> ClusterShape:
    """The mini cluster ``profile`` describes; ``gpus_per_node`` where the profile does not say."""
    generic = ["node sizes (CPUs, memory)"]
    assumed = dict(profile.assumed)
    partitions = tuple(
        ShapedPartition(
            p.name,
            None if p.max_time_s is None else math.ceil(p.max_time_s / 60),
            p is profile.default_partition,
            p.qos,
            p.gpu_types,
            p.preemptible,
        )
        for p in profile.partitions
    )
    preemption = profile.preemption
    if any(p.preemptible for p in profile.partitions):
        if preemption.send_user_signal is None:
            generic.append("whether a preempted job gets its --signal first (here: no, Slurm's default)")
        if preemption.grace_time_s is None:
            generic.append(f"a preempted job's grace time (here: {GENERIC_GRACE_TIME_S} s)")
    for p in profile.partitions:
        unknown = [
            fact for fact in ("gpus_per_node", "gpu_types", "cpus_per_gpu") if getattr(p, fact) is None
        ]
        if unknown:
            generic.append(f"{p.name}: {', '.join(unknown)}")
    if profile.apptainer.fuse is None:
        generic.append("FUSE on compute nodes (there, and a job checks)")
    types = tuple(dict.fromkeys(t for p in profile.partitions for t in (p.gpu_types or ())))
    if any(p.gpu_types is None for p in profile.partitions) and len(profile.partitions) > 1:
        generic.append("partitions of unknown GPU types share nodes, with every type the profile names")
    # Each type gets the largest known count per node (a node with several types holds each of them).
    per_type = max((p.gpus_per_node for p in profile.partitions if p.gpus_per_node), default=gpus_per_node)
    scratch_variable = profile.node_scratch_variable
    areas = [path for path in profile.shared.values() if _PLAIN_PATH.match(path)]
    areas += [bind.split(":", 1)[0] for bind in profile.apptainer.binds]
    # /home and /data are the mini cluster's own shared volumes; /tmp is every node's own.
    own = ("/home", "/data", "/tmp")
    site_areas = tuple(
        dict.fromkeys(
            area.rstrip("/")
            for area in areas
            if not any(area.rstrip("/") == mine or area.startswith(f"{mine}/") for mine in own)
        )
    )
    assumed_rules = tuple(key for key, rule in RULES.items() if getattr(profile, rule) and key in assumed)
    return ClusterShape(
        profile=profile.name,
        partitions=partitions,
        gpu_types=types,
        gpus_per_type=per_type,
        account_required=profile.account_required and "accounting.account_required" not in assumed,
        qos_required=profile.qos_required and "accounting.qos_required" not in assumed,
        scratch_dir=VARIABLE_SCRATCH_DIR if scratch_variable else profile.node_scratch,
        scratch_variable=scratch_variable,
        site_areas=site_areas,
        module_stub=profile.apptainer.loads_modules,
        generic=tuple(generic),
        runtime=profile.apptainer.command,
        fuse=profile.apptainer.fuse is not False,
        assumed=assumptions(profile),
        area_variables=tuple(
            match[1]
            for path in profile.shared.values()
            if (match := _AREA_VARIABLE.match(path)) and match[1] not in _SET_BY_LOGIN
        ),
        gpu_type_required=profile.gpu_type_required and "gpus.type_required" not in assumed,
        assumed_rules=assumed_rules,
        send_user_signal=bool(preemption.send_user_signal),
        grace_time_s=GENERIC_GRACE_TIME_S if preemption.grace_time_s is None else preemption.grace_time_s,
    )
