"""What a job asks for (GPUs, CPUs, memory, time, ...), checked against a cluster profile.

A `ResourceRequest` holds values as the user typed them (flags over `[tool.hpcbox.resources]` in
pyproject.toml); `resolve` checks it against a profile and returns normalised `Resources`. Every
error names the field at fault and what is allowed.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcbox.errors import FieldError
from hpcbox.render import logpaths
from hpcbox.render.options import RESOURCE_OPTIONS, named
from hpcbox.render.profiles import APPTAINER_COMMANDS, ClusterProfile, Partition, bind_target, check_bind
from hpcbox.tables import Table, load_toml
from hpcbox.units import format_time, parse_mem, parse_time

__all__ = ["FieldError", "ResourceRequest", "Resources", "format_time", "parse_mem", "parse_time", "resolve"]

_ARRAY_RANGE = r"\d+(?:-\d+(?::\d+)?)?"
_ARRAY = re.compile(rf"^{_ARRAY_RANGE}(?:,{_ARRAY_RANGE})*(?:%\d+)?$")
# NVIDIA's MIG profile names (3g.20gb: 3 compute slices, 20 GB), as sites spell slices: a100_3g.20gb.
MIG_SLICE = re.compile(r"(^|_)\d+g\.\d+gb$")
_WORD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_MAIL = re.compile(r"^[^@\s\"'\\]+@[^@\s\"'\\]+$")
_EXTRA = re.compile(r"^--[a-z][a-z0-9-]*(?:=\S.*)?$")
MAIL_TYPES = (
    "NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT", "TIME_LIMIT",
    "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS",
)  # fmt: skip
# sbatch options hpcbox writes itself, with the flag to use instead of --extra.
OWNED_OPTIONS = {
    **{option.sbatch: f"use --{option.flag}" for option in RESOURCE_OPTIONS if option.sbatch},
    "--gpus-per-node": "use --gpus/--gpu-type", "--gpus": "use --gpus",
    "--signal": "it handles the time limit", "--requeue": "it requeues checkpointed jobs",
    "--chdir": "jobs run from their submit directory", "--open-mode": "requeued jobs append to their log",
}  # fmt: skip
# sbatch options that would undo what hpcbox writes: what they do to the job, and what to use instead.
UNDOING_OPTIONS = {
    "--ntasks": "sets a task count beside --ntasks-per-node (use --nodes and --ntasks-per-node)",
    "--ntasks-per-gpu": "sets a task count beside --ntasks-per-node (use --ntasks-per-node)",
    "--no-requeue": "stops the requeue after a checkpoint (use --max-restarts 0)",
    "--gpus-per-task": "allocates GPUs hpcbox starts no process for (use --gpus, per node)",
    "--gpus-per-socket": "allocates GPUs hpcbox starts no process for (use --gpus, per node)",
    "--tres-per-task": "sizes tasks behind --cpus-per-task and the GPU request (use --cpus and --gpus)",
    "--cpus-per-gpu": "conflicts with --cpus-per-task (use --cpus: CPUs per task, one task per GPU)",
    "--wrap": "replaces the job script (name the program in [tool.hpcbox.run])",
    "--wait": "keeps sbatch from returning (follow the job with `hpcbox status` or `hpcbox logs --follow`)",
}
# Generic resources that reach GPUs (or take the job's away): only --gpus/--gpu-type ask for those.
GPU_GRES = ("gpu", "mps", "shard", "none")
_GRES = re.compile(r"^[A-Za-z0-9_]+(?::[A-Za-z0-9_.-]+)*(?:,[A-Za-z0-9_]+(?::[A-Za-z0-9_.-]+)*)*$")
# Allowed only without --mem: sbatch takes one way of sizing memory.
PER_UNIT_MEMORY = ("--mem-per-cpu", "--mem-per-gpu")
# LSF mails when a job starts (bsub -B) and when it ends (-N), whatever the end was.
LSF_MAIL_TYPES = ("NONE", "BEGIN", "END", "FAIL", "ALL")
# Log name patterns an LSF job can carry: %J and %I are LSF's own, %x hpcbox writes out itself.
LSF_LOG_PATTERNS = ("%j", "%A", "%a", "%x")
DEFAULT_SIGNAL_MARGIN_S = 300
# How often a checkpointed job requeues itself: enough for a week on a one-day partition, and bounded,
# so a trainer that checkpoints without progressing cannot hold a place in the queue forever.
DEFAULT_MAX_RESTARTS = 10
MAX_RESTARTS_LIMIT = 100
# How often a running job copies its checkpoints and results to shared storage: what a dead node can
# lose. Often enough to lose little of a day's training; rarely enough that copying costs little.
DEFAULT_SYNC_EVERY_S = 600
MIN_SYNC_EVERY_S = 5
# What sbatch takes from its environment when its command line does not say (and before #SBATCH lines).
SBATCH_ENVIRONMENT = {"account": "SBATCH_ACCOUNT", "partition": "SBATCH_PARTITION", "qos": "SBATCH_QOS"}
LISTS = named(tuple)
SWITCHES = named(bool)
WHOLE_NUMBERS = named(int)


@dataclass(frozen=True)
class ResourceRequest:
    """Resources as given, before checking; None means "not asked for"."""

    job_name: str | None = None
    partition: str | None = None
    gpus: int | None = None
    gpu_type: str | None = None
    cpus: int | None = None
    mem: str | None = None
    time: str | None = None
    nodes: int | None = None
    ntasks_per_node: int | None = None
    account: str | None = None
    qos: str | None = None
    array: str | None = None
    mail_user: str | None = None
    mail_type: str | None = None
    extra: tuple[str, ...] = ()
    max_restarts: int | None = None
    sync_every: str | None = None
    log: str | None = None
    error_log: str | None = None
    container: str | None = None
    cleanenv: bool | None = None
    no_home: bool | None = None
    bind: tuple[str, ...] = ()
    home: str | None = None
    sif_on_scratch: bool | None = None
    unpack_sif: bool | None = None

    def over(self, defaults: ResourceRequest) -> ResourceRequest:
        """This request with its unset fields taken from `defaults`."""
        merged = {
            f.name: getattr(self, f.name)
            if getattr(self, f.name) not in (None, ())
            else getattr(defaults, f.name)
            for f in dataclasses.fields(self)
        }
        return ResourceRequest(**merged)


@dataclass(frozen=True)
class ContainerOptions:
    """How this job's container runs, on top of the profile's [apptainer] settings."""

    command: str | None = None  # apptainer or singularity; None: the profile's
    cleanenv: bool = False  # --cleanenv: none of the host's environment in the container
    no_home: bool = False  # --no-home: the home directory is not mounted
    binds: tuple[str, ...] = ()  # more --bind specs, after the profile's
    home: str | None = None  # --home /host[:/container]
    sif_on_scratch: bool = False  # each node runs a copy of the SIF on its scratch
    # Each node runs the SIF unpacked to its scratch: True always, False never, None where a node cannot
    # mount it (the profile does not know whether the site's nodes have FUSE).
    unpack_sif: bool | None = False


@dataclass(frozen=True)
class Resources:
    """A checked request, in the units sbatch wants."""

    job_name: str
    partition: Partition
    gpus: int = 0
    gpu_type: str | None = None
    cpus_per_task: int | None = None
    mem: str | None = None  # e.g. "16G"
    time_s: int | None = None
    nodes: int = 1
    ntasks_per_node: int = 1
    account: str | None = None
    qos: str | None = None
    array: str | None = None
    mail_user: str | None = None
    mail_type: str | None = None
    extra: tuple[str, ...] = ()
    signal_margin_s: int = DEFAULT_SIGNAL_MARGIN_S
    max_restarts: int = DEFAULT_MAX_RESTARTS
    sync_every_s: int = DEFAULT_SYNC_EVERY_S  # 0: results reach shared storage only when the job ends
    log: str | None = None  # sbatch --output pattern; None: hpcbox's default under the log folder
    error_log: str | None = None  # sbatch --error pattern; None: stderr goes to the log
    container: ContainerOptions = ContainerOptions()
    # The profile's rules marked assumed (typed from docs, not verified) that this job does not meet: a
    # line each, said as a warning. The job goes to the site as it is; its sbatch decides.
    unverified: tuple[str, ...] = ()

    @property
    def tasks(self) -> int:
        return self.nodes * self.ntasks_per_node


def resolve(profile: ClusterProfile, request: ResourceRequest, *, ddp: bool = True) -> Resources:
    """Check `request` against `profile`; the first problem found raises FieldError.

    ``ddp``: the job's processes are DDP ranks (torchrun), so each takes a GPU of its own and there are
    as many per node as GPUs unless asked otherwise; else a task count is Slurm's plain one.
    """
    job_name = _job_name(request.job_name)
    partition = profile.partition(request.partition)
    gpus = _at_least("gpus", request.gpus, 0, default=0)
    cpus = _at_least("cpus", request.cpus, 1, default=None)
    nodes = _at_least("nodes", request.nodes, 1, default=1)
    ntasks = _at_least("ntasks_per_node", request.ntasks_per_node, 1, default=None)
    ntasks = ddp_processes(gpus, ntasks) if ddp and gpus else ntasks or 1
    if profile.lsf:
        _lsf_request(profile, request, nodes=nodes, processes=ntasks, ddp=ddp)
    unverified: list[str] = []
    gpu_type = _gpu_type(profile, partition, gpus, request.gpu_type, unverified)
    _mig_slices(profile, gpu_type, gpus * nodes)
    if partition.gpus_per_node is not None and gpus > partition.gpus_per_node:
        raise FieldError(
            "gpus",
            f"{gpus} exceeds the {partition.gpus_per_node} GPUs per node of {profile.place} "
            f"{partition.name!r} (allowed: 0-{partition.gpus_per_node})",
        )
    if gpus and cpus and partition.cpus_per_gpu is not None:
        per_gpu = cpus * ntasks / gpus
        if per_gpu > partition.cpus_per_gpu:
            raise FieldError(
                "cpus",
                f"{cpus} CPUs per task x {ntasks} tasks for {gpus} GPUs is {per_gpu:g} CPUs per GPU, above "
                f"the {partition.cpus_per_gpu} allowed on {profile.place} {partition.name!r} "
                f"(allowed: up to {partition.cpus_per_gpu * gpus // ntasks} CPUs per task)",
            )
    _site_defaults(profile, gpus, request, unverified)
    time_s = parse_time(request.time) if request.time is not None else None
    if time_s is not None and partition.max_time_s is not None and time_s > partition.max_time_s:
        raise FieldError(
            "time",
            f"{format_time(time_s)} exceeds the limit of {profile.place} {partition.name!r} "
            f"(allowed: up to {format_time(partition.max_time_s)})",
        )
    return Resources(
        job_name=job_name,
        partition=partition,
        gpus=gpus,
        gpu_type=gpu_type,
        cpus_per_task=cpus,
        mem=parse_mem(request.mem) if request.mem is not None else None,
        time_s=time_s,
        nodes=nodes,
        ntasks_per_node=ntasks,
        account=_account(profile, request.account, unverified),
        qos=_qos(profile, partition, request.qos, unverified),
        array=_array(request.array),
        mail_user=_mail_user(request.mail_user),
        mail_type=_mail_type(request.mail_type, request.mail_user),
        extra=_extras(request.extra, request.mem),
        signal_margin_s=signal_margin(time_s),
        max_restarts=_max_restarts(request.max_restarts),
        sync_every_s=_sync_every(request.sync_every),
        log=_log("log", request.log, request.array),
        error_log=_log("error_log", request.error_log, request.array),
        container=_container(profile, request),
        unverified=tuple(unverified),
    )


def _rule_not_met(
    profile: ClusterProfile, key: str, refusal: FieldError, unverified: list[str], goes: str = "as it is"
) -> None:
    """A job that does not meet the profile's rule ``key``: refused where the profile states the rule as
    the site's, let through with a line in ``unverified`` where the profile marks it assumed (a rule no
    site document states must never refuse a job the site would run); ``goes`` says how it goes."""
    if key not in dict(profile.assumed):
        raise refusal
    unverified.append(
        f"{refusal.message.split(' (allowed: ')[0]}, by the profile's assumption ({key} is under `assumed`: "
        f"the site does not publish it); the job goes {goes}, and the site's sbatch decides"
    )


def _lsf_request(
    profile: ClusterProfile, request: ResourceRequest, *, nodes: int, processes: int, ddp: bool
) -> None:
    """What an LSF job script cannot say the way hpcbox renders it: one node, no Slurm-only options."""
    lsf = f"cluster {profile.name!r} uses LSF"
    if nodes > 1:
        raise FieldError("nodes", f"{nodes}: {lsf}, where hpcbox renders one-node jobs (allowed: 1)")
    if processes > 1 and not ddp:
        raise FieldError(
            "ntasks_per_node",
            f"{processes} tasks: {lsf}, where hpcbox has no srun to start one process per task (allowed: 1)",
            'for DDP, set launcher = "torchrun" in [tool.hpcbox.run]',
        )
    refused = {
        "qos": (request.qos, f"{lsf}, which has no QOS (leave it out)"),
        "gpu_type": (request.gpu_type, f"{lsf}, where the queue decides the GPU model (pick the queue)"),
        "extra": (request.extra, f"{lsf}: these are sbatch options (no --extra for LSF yet)"),
    }
    for field_name, (given, why) in refused.items():
        if given:
            raise FieldError(field_name, f"{given!r}: {why}")
    kinds = request.mail_type.split(",") if request.mail_type else []
    unsupported = [kind for kind in kinds if kind not in LSF_MAIL_TYPES]
    if unsupported:
        raise FieldError(
            "mail_type",
            f"{unsupported[0]!r}: {lsf}, which mails at a job's start and end only "
            f"(allowed: {', '.join(LSF_MAIL_TYPES)})",
        )
    for field_name in ("log", "error_log"):
        pattern = getattr(request, field_name) or ""
        other = [token for token in re.findall(r"%\d*.", pattern) if token not in LSF_LOG_PATTERNS]
        if other:
            raise FieldError(
                field_name,
                f"{pattern!r}: {other[0]} has no LSF equivalent on {lsf} "
                f"(allowed: {' '.join(LSF_LOG_PATTERNS)})",
            )
    if request.array and _ARRAY.match(request.array):
        starts = [int(re.split("[-:]", item)[0]) for item in request.array.split("%")[0].split(",")]
        if 0 in starts:
            raise FieldError("array", f"{request.array!r}: LSF array indices start at 1 ({lsf})")


def ddp_processes(gpus: int, ntasks_per_node: int | None) -> int:
    """DDP processes per node on `gpus` GPUs per node: one per GPU, since each rank takes its own."""
    if ntasks_per_node not in (None, gpus):
        raise FieldError(
            "ntasks_per_node",
            f"{ntasks_per_node} DDP processes per node on {gpus} GPU{'s' if gpus > 1 else ''} per node: "
            f"each process needs a GPU of its own (allowed: {gpus}, or leave it out)",
            'a program that is not DDP: set launcher = "srun" in [tool.hpcbox.run]',
        )
    return gpus


def project_defaults(pyproject: Path, cluster: str) -> ResourceRequest:
    """`[tool.hpcbox.resources]`, with its `[tool.hpcbox.resources.<cluster>]` table on top."""
    if not pyproject.is_file():
        return ResourceRequest()
    tool = Table(load_toml(pyproject), "").table("tool", required=False).table("hpcbox", required=False)
    table = tool.table("resources", required=False)
    # A table in it is a cluster's own; only this cluster's is read.
    clusters = [key for key, value in table.data.items() if isinstance(value, dict)]
    base = _request_from_table(table, also_allowed=clusters)
    return _request_from_table(table.table(cluster, required=False)).over(base)


def request_for(
    cluster: str,
    flags: dict[str, Any],
    pyproject: Path,
    project_name: str,
    environ: Mapping[str, str] | None = None,
) -> ResourceRequest:
    """Flags (strings, as typed) over SBATCH_ACCOUNT/PARTITION/QOS in ``environ`` over the project's
    defaults for `cluster`, as sbatch ranks its options, environment and #SBATCH lines; jobs take the
    project's name."""
    # A flag left off is not asked for: it neither sets False nor an empty list over the defaults.
    given = {
        name: value for name, value in flags.items() if value not in (None, [], ()) and value is not False
    }
    for name, variable in SBATCH_ENVIRONMENT.items():
        value = (environ or {}).get(variable)
        if value and name not in given:
            if not _WORD.match(value):
                raise FieldError(variable, f"{value!r} is not a Slurm {name} name")
            given[name] = value
    for name in WHOLE_NUMBERS:
        if name in given:
            given[name] = _whole_number(name, given[name])
    for name in LISTS:
        if name in given:
            given[name] = tuple(given[name])
    request = ResourceRequest(**given).over(project_defaults(pyproject, cluster))
    return request if request.job_name else dataclasses.replace(request, job_name=project_name)


def _whole_number(field_name: str, value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise FieldError(field_name, f"{value!r} is not a whole number") from None


def _request_from_table(table: Table, also_allowed: list[str] | None = None) -> ResourceRequest:
    """A `[tool.hpcbox.resources]` table; a key is spelled as the flag (gpu-type) or as the option
    (gpu_type)."""
    values: dict[str, Any] = {}
    for option in RESOURCE_OPTIONS:
        for key in dict.fromkeys((option.flag, option.name)):
            if key == option.flag or key in table:
                value = _typed(table, key, option.kind)
                if value is not None:
                    values[option.name] = value
    table.reject_extra(also_allowed or (), what="resource")
    return ResourceRequest(**values)


def _typed(table: Table, key: str, kind: type) -> Any:
    if kind is tuple:
        return tuple(table.str_list(key, default=[], hint='e.g. ["--exclusive"]')) or None
    return table.get(key, kind)


def _job_name(name: str | None) -> str:
    if not name:
        raise FieldError("job_name", "is empty", "pass --job-name NAME")
    bad = [char for char in name if unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp")]
    if bad:
        raise FieldError("job_name", f"{name!r} contains control characters ({bad[0]!r})")
    return name


def _at_least(field_name: str, value: int | None, minimum: int, *, default: int | None) -> Any:
    if value is None:
        return default
    if value < minimum:
        raise FieldError(field_name, f"{value} is below {minimum} (allowed: {minimum} or more)")
    return value


def _sync_every(value: str | None) -> int:
    if value is None:
        return DEFAULT_SYNC_EVERY_S
    if re.fullmatch(r"[0:-]+", value.strip()):  # zero however written: only at the end
        return 0
    seconds = parse_time(value, "sync_every")
    if seconds < MIN_SYNC_EVERY_S:
        raise FieldError(
            "sync_every",
            f"{value!r} is under {MIN_SYNC_EVERY_S} s: copying would never rest "
            f"(allowed: {MIN_SYNC_EVERY_S} s or more, e.g. 10:00, or 0 for only at the end)",
        )
    return seconds


def _max_restarts(value: int | None) -> int:
    restarts = _at_least("max_restarts", value, 0, default=DEFAULT_MAX_RESTARTS)
    if restarts > MAX_RESTARTS_LIMIT:
        raise FieldError(
            "max_restarts", f"{restarts} is above {MAX_RESTARTS_LIMIT} (allowed: 0-{MAX_RESTARTS_LIMIT})"
        )
    return restarts


def _gpu_type(
    profile: ClusterProfile, partition: Partition, gpus: int, gpu_type: str | None, unverified: list[str]
) -> str | None:
    if not gpus:
        if gpu_type:
            raise FieldError("gpu_type", f"{gpu_type!r} given without any GPUs", "add --gpus N")
        return None
    allowed = ", ".join(partition.gpu_types) if partition.gpu_types is not None else "not published"
    if gpu_type is None:
        gpu_type = partition.default_gpu_type
        if gpu_type is None and profile.gpu_type_required:
            if partition.gpu_types is None or len(partition.gpu_types) != 1:
                refusal = FieldError(
                    "gpu_type",
                    f"cluster {profile.name!r} needs a GPU type (allowed on {partition.name!r}: {allowed})",
                    "pass --gpu-type TYPE",
                )
                _rule_not_met(profile, "gpus.type_required", refusal, unverified)
                return None
            gpu_type = partition.gpu_types[0]
        return gpu_type
    if not _WORD.match(gpu_type):
        raise FieldError("gpu_type", f"{gpu_type!r} is not a GPU type name")
    if partition.gpu_types is not None and gpu_type not in partition.gpu_types:
        raise FieldError(
            "gpu_type",
            f"partition {partition.name!r} has no {gpu_type!r} GPUs (allowed: {allowed or 'none'})",
        )
    return gpu_type


def _container(profile: ClusterProfile, request: ResourceRequest) -> ContainerOptions:
    if request.container is not None and request.container not in APPTAINER_COMMANDS:
        raise FieldError("container", f"{request.container!r} (allowed: {', '.join(APPTAINER_COMMANDS)})")
    taken = {bind_target(spec): "the profile" for spec in profile.apptainer.binds}
    for spec in request.bind:
        check_bind("bind", spec)
        if bind_target(spec) in taken:
            raise FieldError(
                "bind", f"{spec!r}: {bind_target(spec)} is already bound by {taken[bind_target(spec)]}"
            )
        taken[bind_target(spec)] = "an earlier --bind"
    if request.home is not None:
        if request.no_home:
            raise FieldError("home", "given with --no-home (use one of them)")
        check_bind("home", request.home)
    return ContainerOptions(
        command=request.container,
        cleanenv=bool(request.cleanenv),
        no_home=bool(request.no_home),
        binds=request.bind,
        home=request.home,
        sif_on_scratch=(
            profile.apptainer.sif_on_scratch if request.sif_on_scratch is None else request.sif_on_scratch
        ),
        unpack_sif=(
            (None if profile.apptainer.fuse is None else not profile.apptainer.fuse)
            if request.unpack_sif is None
            else request.unpack_sif
        ),
    )


def _mig_slices(profile: ClusterProfile, gpu_type: str | None, slices: int) -> None:
    limit = profile.max_mig_slices
    if gpu_type and MIG_SLICE.search(gpu_type) and limit is not None and slices > limit:
        raise FieldError(
            "gpus",
            f"{slices} {gpu_type} MIG slices in one job; cluster {profile.name!r} allows up to {limit} "
            f"(allowed: {limit}, or whole GPUs)",
        )


def _site_defaults(
    profile: ClusterProfile, gpus: int, request: ResourceRequest, unverified: list[str]
) -> None:
    """A GPU job that leaves its time, memory or CPUs to the site gets its defaults, which no profile
    records (often one CPU, a little memory and a short limit: GPUs that wait for data, or a kill): one
    line naming what it did not ask for."""
    missing = [
        flag
        for flag, given in (("--time", request.time), ("--mem", request.mem), ("--cpus", request.cpus))
        if given is None
    ]
    if gpus and missing:
        said = ", ".join(missing[:-1]) + (" or " if len(missing) > 1 else "") + missing[-1]
        unverified.append(
            f"a job with {gpus} GPU{'s' if gpus > 1 else ''} that asks for no {said} gets {profile.name}'s "
            "defaults there, which its profile does not record (often 1 CPU, a little memory, a short "
            "limit): ask for what it needs"
        )


def _account(profile: ClusterProfile, account: str | None, unverified: list[str]) -> str | None:
    if account is None:
        if profile.account_required:
            example = f", e.g. {profile.account_hint}" if profile.account_hint else ""
            refusal = FieldError(
                "account",
                f"cluster {profile.name!r} requires an account "
                f"(allowed: a Slurm account you belong to{example})",
                "pass --account, set SBATCH_ACCOUNT, or set account in [tool.hpcbox.resources.<cluster>]",
            )
            # Slurm charges a job that names no account to the user's default one.
            _rule_not_met(
                profile, "accounting.account_required", refusal, unverified, "to your default account"
            )
        return None
    if not _WORD.match(account):
        raise FieldError("account", f"{account!r} is not a Slurm account name")
    if profile.accounts is not None and account not in profile.accounts:
        raise FieldError(
            "account",
            f"{account!r} is not one of cluster {profile.name!r}'s accounts (allowed: "
            f"{', '.join(profile.accounts) or 'none listed'})",
            f"add it to [accounting] accounts in {profile.source or 'the profile'} if the site has it",
        )
    return account


def _qos(profile: ClusterProfile, partition: Partition, qos: str | None, unverified: list[str]) -> str | None:
    if partition.qos and qos not in (None, partition.qos):
        raise FieldError(
            "qos", f"partition {partition.name!r} requires qos {partition.qos!r} (allowed: {partition.qos})"
        )
    qos = qos or partition.qos
    if qos is None and profile.qos_required:
        refusal = FieldError(
            "qos", f"cluster {profile.name!r} requires a QOS", "pass --qos, or set SBATCH_QOS"
        )
        _rule_not_met(profile, "accounting.qos_required", refusal, unverified)
    if qos is not None and not _WORD.match(qos):
        raise FieldError("qos", f"{qos!r} is not a QOS name")
    return qos


def _array(spec: str | None) -> str | None:
    if spec is not None and not _ARRAY.match(spec):
        raise FieldError("array", f"{spec!r} is not a job array spec (allowed: e.g. 0-9, 1,3,5, 0-99:2%10)")
    return spec


def _log(field_name: str, pattern: str | None, array: str | None) -> str | None:
    return None if pattern is None else logpaths.check(field_name, pattern, array=array is not None)


def _mail_user(address: str | None) -> str | None:
    if address is not None and not _MAIL.match(address):
        raise FieldError("mail_user", f"{address!r} is not an e-mail address")
    return address


def _mail_type(kinds: str | None, address: str | None) -> str | None:
    if kinds is None:
        return "END,FAIL" if address else None
    for kind in kinds.split(","):
        if kind not in MAIL_TYPES:
            raise FieldError("mail_type", f"{kind!r} is not a mail type (allowed: {', '.join(MAIL_TYPES)})")
    return kinds


def _extras(options: tuple[str, ...], mem: str | None) -> tuple[str, ...]:
    names = [_extra_name(option, mem) for option in options]
    for index, name in enumerate(names):
        if name in names[:index]:
            raise FieldError("extra", f"{name} is given twice (sbatch keeps only the last; give it once)")
    return options


def _extra_name(option: str, mem: str | None) -> str:
    """The option's name, once it is one sbatch option that does not undo what hpcbox writes."""
    if not _EXTRA.match(option) or any(unicodedata.category(char) == "Cc" for char in option):
        raise FieldError("extra", f"{option!r} is not one sbatch option (allowed: --name or --name=value)")
    name, _, value = option.partition("=")
    if name in OWNED_OPTIONS:
        raise FieldError("extra", f"{name} is written by hpcbox ({OWNED_OPTIONS[name]})")
    if name in UNDOING_OPTIONS:
        raise FieldError("extra", f"{name} {UNDOING_OPTIONS[name]}")
    if name in PER_UNIT_MEMORY and mem is not None:
        raise FieldError("extra", f"{name} conflicts with --mem {mem} (use one of them)")
    if name == "--gres":
        _site_gres(value)
    # sbatch takes any unambiguous prefix of an option's name: --part=x would be --partition=x.
    known = (*OWNED_OPTIONS, *UNDOING_OPTIONS, *PER_UNIT_MEMORY, "--gres")
    spelled_out = sorted(option for option in known if option.startswith(name))
    if spelled_out and name not in spelled_out:
        raise FieldError(
            "extra", f"{name} abbreviates {' or '.join(spelled_out)} (spell sbatch options out in full)"
        )
    return name


def _site_gres(value: str) -> None:
    """--gres for the site's other generic resources (e.g. local disk); GPUs go through --gpus."""
    if not _GRES.match(value):
        raise FieldError("extra", f"--gres={value}: not a list of name[:type][:count] (e.g. lscratch:10)")
    for item in value.split(","):
        if item.split(":", 1)[0].lower() in GPU_GRES:
            raise FieldError(
                "extra", f"--gres={value}: {item} reaches GPUs behind hpcbox's back (use --gpus/--gpu-type)"
            )


def signal_margin(time_s: int | None) -> int:
    """Seconds before the time limit at which the trainer is told to checkpoint (Slurm is exact to ~60 s)."""
    if time_s is None:
        return DEFAULT_SIGNAL_MARGIN_S
    return max(60, min(DEFAULT_SIGNAL_MARGIN_S, time_s // 10))
