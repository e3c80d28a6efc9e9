"""`hpcbox profile.draft --host HOST -o FILE`: a cluster profile written from what the site reports.

Over one SSH connection the login node answers a probe script (the doctor's way, each probe under its
own time limit): Slurm's version, every partition as `scontrol show partition` prints it, the gres of
each partition's nodes (`sinfo`), the user's associations (`sacctmgr`), the container runtime on PATH
or as an environment module, the shared areas the login shell names. Then `sbatch --test-only` asks
which of an account, a QOS and a GPU type the site refuses a job without. With a probe job, a
one-minute job on the default partition tells what only a compute node can: the folder the site sets
per job for node scratch (or the node-local disk), the runtime there, whether it reaches the internet.

What the site did not tell is marked as the shipped profiles mark it: a partition fact not seen is in
that partition's `unknown`; a setting hpcbox needs a value for gets a generic one, named in `assumed`
(and so in every job script); the conventions no Slurm reports (CONVENTIONS) keep hpcbox's defaults
under a comment that says so. A partition whose access lists (AllowAccounts, AllowGroups, ...) may keep
the user out is drafted only when named, and its lists are said either way. The text is read back as a
profile before it is written, and nothing is written on any error.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from hpcbox.errors import FieldError, HpcboxError
from hpcbox.files import write_atomically
from hpcbox.render.profiles import parse_profile
from hpcbox.store import PRIVATE
from hpcbox.store.ship import DEFAULT_REMOTE_ROOT
from hpcbox.survey.doctor import NOT_RUN, Probed, ask
from hpcbox.tables import NAME, toml_value
from hpcbox.tools import slurm, ssh

# What a site's Slurm does not report, which a draft leaves at hpcbox's defaults for the user to set
# from the site's documentation: top-level settings, then a partition's.
CONVENTIONS = (
    "gpus.request",
    "gpus.max_mig_slices",
    "accounting.account_hint",
    "apptainer.options",
    "apptainer.binds",
    "apptainer.workdir_on_scratch",
    "apptainer.sif_on_scratch",
    "prelude",
)
PARTITION_CONVENTIONS = ("implicit", "preemptible", "default_gpu_type")
# Where sites keep node-local disk for jobs, tried in this order after a folder set per job.
SCRATCH_CANDIDATES = (
    "/disk/scratch",
    "/scratch_local",
    "/local_scratch",
    "/localscratch",
    "/local/scratch",
    "/scratch/local",
    "/lscratch",
)
# File systems that are shared between nodes, not node-local (`stat -f -c %T` names them so).
_SHARED_FILE_SYSTEMS = re.compile(r"^(nfs\d?|lustre|gpfs|beegfs|cifs|smb2?|ceph|fuse.*|9p|autofs|panfs)$")
# Environment variables of a login shell that name a site's shared areas, by the profile key they fill.
AREA_VARIABLES = {"project": "PROJECT", "scratch": "SCRATCH"}
# A partition's access lists as scontrol prints them: who may use it (groups, accounts), under which QOS.
ACCESS_SETTINGS = ("AllowGroups", "AllowAccounts", "DenyAccounts", "AllowQos", "DenyQos")
# The PreemptModes that take a running job off its nodes (slurm.conf): OFF does not, nor GANG alone,
# which time-slices a partition's own jobs.
PREEMPTING_MODES = frozenset({"CANCEL", "REQUEUE", "SUSPEND"})
# A gres type named as a MIG profile (a100_3g.20gb, nvidia_h100_80gb_hbm3_1g.10gb): a slice of a GPU.
_MIG_PROFILE = re.compile(r"\d+g\.\d+gb", re.IGNORECASE)
PROBE_JOB_DIR = f"{DEFAULT_REMOTE_ROOT}/probe"  # under the login's home
PROBE_JOB_WAIT_S = 600  # a probe job not ended by then is cancelled: the draft is refused, not half made
TEST_ONLY_TIMEOUT_S = 15
_MARK = "@@hpcbox-probe-job"


@dataclass(frozen=True)
class Access:
    """One of a partition's access lists as scontrol prints it (AllowAccounts=def-a,def-b); ALL is none."""

    setting: str  # AllowGroups, AllowAccounts, AllowQos, DenyAccounts or DenyQos
    names: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.setting}={','.join(self.names)}"


@dataclass(frozen=True)
class SeenPartition:
    """A partition as `scontrol show partition --oneliner` and `sinfo` print it."""

    name: str
    default: bool
    max_time: str | None  # as Slurm prints it (7-00:00:00); None: UNLIMITED
    nodes: int
    state: str
    access: tuple[Access, ...]  # the lists that are not ALL
    # Each node's gres, as sinfo prints it (a node with none is left out); None: sinfo printed no line
    # for the partition's nodes (the probe did not answer, or sinfo hid the partition from the user).
    gres: tuple[str, ...] | None = ()
    gpus_in_tres: int | None = None  # the partition's GPUs all told (TRES gres/gpu=N); None: not named
    preempt_mode: str = "OFF"  # the partition's own, else the cluster's (scontrol prints that)
    grace_time_s: int = 0
    # The partitions of a higher PriorityTier sharing a node with this one: with preemption by
    # partition (PreemptType=preempt/partition_prio) their jobs preempt this one's.
    outranked_by: tuple[str, ...] = ()

    @property
    def gpu_types(self) -> tuple[str, ...] | None:
        """The GPU types of its nodes (() where they are untyped or have none); None: not seen."""
        if self.gres is None:
            return None
        return tuple(dict.fromkeys(t for gres in self.gres for t, _ in slurm.gpu_gres(gres) if t))

    @property
    def gpus_per_node(self) -> int | None:
        """The most GPUs a node of it has; None: not seen."""
        if self.gres is not None:
            return max((sum(n for _, n in slurm.gpu_gres(gres)) for gres in self.gres), default=0)
        # A partition's TRES is its nodes' sum: one node's count alone, unless the GPUs may lie unevenly.
        return self.gpus_in_tres if self.nodes == 1 else None

    @property
    def mig_types(self) -> tuple[str, ...]:
        """Its GPU types named as MIG profiles (a100_3g.20gb): Slurm counts each slice as a GPU."""
        return tuple(t for t in self.gpu_types or () if _MIG_PROFILE.search(t))

    @property
    def qos(self) -> str | None:
        """The one QOS the partition allows (M3's desktop: desktopq), if it allows one alone."""
        allowed = next((a.names for a in self.access if a.setting == "AllowQos"), ())
        return allowed[0] if len(allowed) == 1 else None

    @property
    def preempts(self) -> bool:
        """Whether its PreemptMode takes a preempted job off its nodes (not OFF, nor GANG alone)."""
        return bool(set(self.preempt_mode.upper().split(",")) & PREEMPTING_MODES)

    @property
    def preemptible(self) -> bool:
        """Whether scontrol's output shows its jobs preempted: its PreemptMode preempts, and partitions
        of a higher PriorityTier share its nodes."""
        return self.preempts and bool(self.outranked_by)


@dataclass(frozen=True)
class Site:
    """What the login node said."""

    slurm_version: str
    partitions: tuple[SeenPartition, ...]
    accounts: tuple[str, ...]
    default_account: str | None
    qos: tuple[str, ...]
    runtime: str | None  # "apptainer" or "singularity", on PATH
    runtime_seen: str  # its path and version, for people
    runtime_module: str | None  # an environment module of that name, where the runtime is not on PATH
    modules: bool  # the site has a `module` command
    areas: dict[str, str] = field(default_factory=dict)  # profile key -> "$VARIABLE"


@dataclass(frozen=True)
class Rules:
    """What `sbatch --test-only` showed the site requires; None: it could not tell."""

    account_required: bool | None
    qos_required: bool | None
    gpu_type_required: bool | None
    said: tuple[str, ...] = ()  # the evidence, a line each, for the file's comments
    flags: tuple[str, ...] = ()  # the account and QOS flags a job needs there


@dataclass(frozen=True)
class ComputeNode:
    """What the probe job saw on a compute node."""

    node: str
    scratch: str | None  # "$VARIABLE" set per job, or a node-local folder; None: /tmp alone
    scratch_seen: str
    runtime: str | None
    internet: bool | None


def probe_commands() -> dict[str, str]:
    """The probes the login node runs (the doctor's way: at once, in one login shell, one deadline)."""
    runtime = (
        'for c in apptainer singularity; do if p=$(command -v $c); then echo "$c $p"; $c --version; '
        "exit 0; fi; done; exit 1"
    )
    areas = " ".join(f'{key}="${{{name}-}}"' for key, name in AREA_VARIABLES.items())
    probes = {
        "slurm": "sinfo --version",
        "partitions": "scontrol show partition --oneliner",
        "gres": "sinfo --noheader --Node --format='%R|%N|%G'",
        "associations": 'sacctmgr --noheader --parsable2 show assoc user="$USER" format=Account,QOS',
        "default_account": 'sacctmgr --noheader --parsable2 show user "$USER" format=DefaultAccount',
        "runtime": runtime,
        "modules": "type -t module && { module -t avail apptainer singularity 2>&1; true; }",
        "areas": f"printf '%s\\n' {areas}",
    }
    return probes


def parse_partitions(scontrol: str, gres: str | None) -> tuple[SeenPartition, ...]:
    """The partitions in `scontrol show partition --oneliner` output, with each node's gres from
    `sinfo --Node --format=%R|%N|%G` (None: that probe did not answer)."""
    gres_of: dict[str, list[str]] = {}
    for line in (gres or "").splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            listed = gres_of.setdefault(parts[0], [])
            listed += [] if parts[2] in ("", "(null)") else [parts[2]]
    rows = [dict(re.findall(r"(\w+)=(\S*)", line)) for line in scontrol.splitlines()]
    rows = [words for words in rows if "PartitionName" in words]
    hosts = {words["PartitionName"]: hostnames(words.get("Nodes", "")) for words in rows}
    tiers = {words["PartitionName"]: _number(words.get("PriorityTier")) for words in rows}
    found = []
    for words in rows:
        name = words["PartitionName"]
        limit = words.get("MaxTime", "UNLIMITED")
        tres = dict(item.split("=", 1) for item in words.get("TRES", "").split(",") if "=" in item)
        found.append(
            SeenPartition(
                name=name,
                default=words.get("Default") == "YES",
                max_time=None if limit.upper() in ("UNLIMITED", "INFINITE") else limit,
                nodes=int(words["TotalNodes"]) if words.get("TotalNodes", "").isdigit() else 0,
                state=words.get("State", "UNKNOWN"),
                access=tuple(
                    Access(setting, tuple(n for n in words[setting].split(",") if n))
                    for setting in ACCESS_SETTINGS
                    if words.get(setting, "ALL") != "ALL"
                ),
                gres=tuple(gres_of[name]) if name in gres_of else None,
                gpus_in_tres=_number(tres.get("gres/gpu")),
                preempt_mode=words.get("PreemptMode", "OFF"),
                grace_time_s=_number(words.get("GraceTime")) or 0,
                outranked_by=tuple(
                    other
                    for other, tier in tiers.items()
                    if (tier or 0) > (tiers[name] or 0) and hosts[other] & hosts[name]
                ),
            )
        )
    return tuple(found)


def _number(word: str | None) -> int | None:
    return int(word) if word and word.isdigit() else None


def hostnames(hostlist: str) -> frozenset[str]:
    """The node names in a Slurm hostlist such as `n[388-392,423-427],g338`, as scontrol prints a
    partition's Nodes; none for `(null)`, a partition without nodes."""
    names: set[str] = set()
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", "" if hostlist == "(null)" else hostlist):
        # n[01-02]-ib[1-2]: text, a range list, text, ..., each range list multiplying what is before it
        parts = re.split(r"\[([^\]]*)\]", item)
        stems = [parts[0]]
        for ranges, text in zip(parts[1::2], parts[2::2], strict=True):
            stems = [stem + number + text for stem in stems for number in _range_list(ranges)]
        names.update(stems)
    return frozenset(names)


def _range_list(ranges: str) -> list[str]:
    """`01-03,7` as ["01", "02", "03", "7"]: each number as wide as the range's first."""
    numbers = []
    for piece in ranges.split(","):
        first, _, last = piece.partition("-")
        if first.isdigit() and last.isdigit():
            numbers += [f"{n:0{len(first)}d}" for n in range(int(first), int(last) + 1)]
        else:
            numbers.append(piece)
    return numbers


def read_site(probed: Mapping[str, Probed], address: str) -> Site:
    """The site from the probe script's answers; a host without Slurm is refused in one line."""
    get = lambda name: probed.get(name, NOT_RUN)  # noqa: E731
    version = get("slurm").output.split()[-1] if get("slurm").answered and get("slurm").output else ""
    if not version:
        raise HpcboxError(
            f"{address} has no Slurm to draft a profile from: `sinfo --version` failed "
            f"({get('slurm').last_line})",
            "draft from the cluster's login node, where Slurm's commands are (--host)",
        )
    if not get("partitions").answered:
        raise HpcboxError(
            f"`scontrol show partition` failed on {address} ({get('partitions').last_line})",
            "ask the site: hpcbox reads the partitions from it",
        )
    associations = get("associations").output if get("associations").answered else ""
    rows = [line.split("|") for line in associations.splitlines() if "|" in line]
    accounts = tuple(dict.fromkeys(row[0] for row in rows if row[0]))
    qos = tuple(dict.fromkeys(q for row in rows if len(row) > 1 for q in row[1].split(",") if q))
    default_account = get("default_account").output.strip() if get("default_account").answered else ""
    runtime_lines = get("runtime").output.splitlines() if get("runtime").answered else []
    runtime, _, runtime_path = runtime_lines[0].partition(" ") if runtime_lines else (None, "", "")
    module_lines = get("modules").output.splitlines() if get("modules").answered else []
    listed = [line.strip().split("/")[0].removesuffix("(default)") for line in module_lines[1:]]
    areas = dict(line.split("=", 1) for line in get("areas").output.splitlines() if "=" in line)
    return Site(
        slurm_version=version,
        partitions=parse_partitions(
            get("partitions").output, get("gres").output if get("gres").answered else None
        ),
        accounts=accounts,
        default_account=default_account.splitlines()[0] if default_account else (accounts or (None,))[0],
        qos=qos,
        runtime=runtime,
        runtime_seen=", ".join([runtime_path, *runtime_lines[1:2]]),
        runtime_module=next((name for name in ("apptainer", "singularity") if name in listed), None),
        modules=bool(module_lines),
        areas={
            key: f"${AREA_VARIABLES[key]}" for key, value in areas.items() if key in AREA_VARIABLES and value
        },
    )


def choose(site: Site, named: Sequence[str]) -> tuple[tuple[SeenPartition, ...], tuple[SeenPartition, ...]]:
    """The partitions to draft (``named``, else every one with nodes whose access lists let the user
    in) and those left out, for having no nodes or being closed to the user (`closed`). A named
    partition the site lacks, or one with no nodes, is refused; one named is drafted closed or not."""
    by_name = {p.name: p for p in site.partitions}
    for name in named:
        if name not in by_name:
            raise FieldError(
                "partitions",
                f"{name!r} is not a partition here (allowed: {', '.join(by_name) or 'none'})",
            )
        if by_name[name].nodes == 0:
            raise FieldError(
                "partitions",
                f"{name!r} has no nodes: no job can run there",
                "leave it out; `sinfo` shows the partitions with nodes",
            )
    if named:
        return tuple(by_name[name] for name in dict.fromkeys(named)), ()
    chosen = tuple(p for p in site.partitions if p.nodes > 0 and not closed(p, site))
    if not chosen:
        with_nodes = [p for p in site.partitions if p.nodes > 0]
        if with_nodes:
            why = "; ".join(f"{p.name}: {closed(p, site)[0]}" for p in with_nodes)
            raise HpcboxError(
                f"no partition here is open to you ({why})",
                "name the ones that are yours with --partitions, or ask the site which to use",
            )
        raise HpcboxError(
            f"no partition here has nodes (scontrol lists {', '.join(by_name) or 'none'})",
            "ask the site which partition to use",
        )
    return chosen, tuple(p for p in site.partitions if p.nodes == 0 or closed(p, site))


def closed(partition: SeenPartition, site: Site) -> tuple[str, ...]:
    """Why ``partition``'s access lists may keep the user's jobs out, one reason per list (none: it is
    open to them), checked against what sacctmgr told of the user: their accounts and QOS."""
    reasons = []
    for access in partition.access:
        if access.setting == "AllowGroups":
            reasons.append(f"{access}, and your groups were not asked")
            continue
        names, yours = set(access.names), set(site.accounts if "Accounts" in access.setting else site.qos)
        if access.setting == "AllowAccounts" and not yours:
            reasons.append(f"{access}, and your accounts were not seen")
        elif access.setting.startswith("Allow") and yours and not yours & names:
            reasons.append(f"{access}, none of yours ({', '.join(sorted(yours))})")
        elif access.setting.startswith("Deny") and yours and yours <= names:
            reasons.append(f"{access}, all of yours")
        # An AllowQos with the user's QOS not seen keeps no one out: it says which QOS a job runs
        # under, not who submits it (Grex names one on every partition, its default included).
    return tuple(reasons)


def _default(partitions: Sequence[SeenPartition]) -> SeenPartition:
    return next((p for p in partitions if p.default), partitions[0])


def _test_only(partition: SeenPartition, flags: Sequence[str]) -> str:
    qos = (
        [f"--qos={partition.qos}"] if partition.qos and not any(f.startswith("--qos=") for f in flags) else []
    )
    argv = ["sbatch", "--test-only", f"--partition={partition.name}", "--time=1", "--ntasks=1"]
    return shlex.join([*argv, *qos, *flags, "--job-name=hpcbox-draft", "--output=/dev/null", "--wrap=true"])


def rules(connection: ssh.Connection, site: Site, partitions: Sequence[SeenPartition]) -> Rules:
    """Which of an account, a QOS and a GPU type the site refuses a job without, by `sbatch
    --test-only` (no job is made): the fewest flags it takes on the default partition, then an untyped
    and a typed GPU request on a partition with typed GPUs."""
    home = _default(partitions)
    account = [f"--account={site.default_account}"] if site.default_account else []
    qos = [f"--qos={site.qos[0]}"] if site.qos and not home.qos else []
    tries = {"none": [], "account": account, "qos": qos, "both": [*account, *qos]}
    tries = {name: flags for name, flags in tries.items() if name == "none" or flags}
    answers = _ask(connection, {name: _test_only(home, flags) for name, flags in tries.items()})
    taken = next((name for name in tries if answers[name].answered), None)
    said = [f"sbatch --test-only on {home.name} with no account or QOS: {_verdict(answers['none'])}"]
    if taken is None:
        return Rules(None, None, None, tuple(said))
    if taken != "none":
        said.append(f"... with {' '.join(tries[taken])}: {_verdict(answers[taken])}")
    flags = tuple(tries[taken])
    typed = next((p for p in (home, *partitions) if p.gpu_types), None)
    if typed is None:
        type_required: bool | None = False  # no GPU type to name
    else:
        requests = {"untyped": "--gres=gpu:1", "typed": f"--gres=gpu:{typed.gpu_types[0]}:1"}
        gpu = _ask(connection, {name: _test_only(typed, [*flags, r]) for name, r in requests.items()})
        type_required = None if not gpu["typed"].answered else not gpu["untyped"].answered
        said.append(f"... on {typed.name} with --gres=gpu:1: {_verdict(gpu['untyped'])}")
        said.append(f"... with {requests['typed']}: {_verdict(gpu['typed'])}")
    return Rules(taken in ("account", "both"), taken in ("qos", "both"), type_required, tuple(said), flags)


def _ask(connection: ssh.Connection, commands: Mapping[str, str]) -> dict[str, Probed]:
    return ask(
        connection,
        commands,
        what=f"ask sbatch --test-only on {connection.target.address}",
        deadline_s=TEST_ONLY_TIMEOUT_S,
    )


def _verdict(probed: Probed) -> str:
    if probed.answered:
        return "taken"
    said = "; ".join(line.strip().removeprefix("sbatch: error: ") for line in probed.output.splitlines())
    return f"refused ({said or f'exit status {probed.status}'})"


def probe_job_script(partition: SeenPartition, flags: Sequence[str]) -> str:
    """A one-minute job printing what its compute node has: folders set per job (a variable whose value
    holds the job id), node-local scratch folders with their file system, the runtime, the internet."""
    lines = [
        "#!/bin/bash",
        "#SBATCH --job-name=hpcbox-draft",
        f"#SBATCH --partition={partition.name}",
        "#SBATCH --time=1",
        "#SBATCH --ntasks=1",
        "#SBATCH --output=draft-%j.out",
        *(f"#SBATCH {flag}" for flag in ([f"--qos={partition.qos}"] if partition.qos else []) + list(flags)),
        f'echo {_MARK} node "$(hostname -s)"',
        "for name in $(compgen -e); do",
        "    case $name in SLURM_JOB_ID | SLURM_JOBID | SLURM_ARRAY_JOB_ID) continue ;; esac",
        "    value=${!name}",
        '    if [[ $value == /* && $value == *"$SLURM_JOB_ID"* && -d $value ]]; then',
        f'        echo {_MARK} jobdir "$name" "$value" "$(stat -f -c %T "$value")"',
        "    fi",
        "done",
        f"for dir in {shlex.join(SCRATCH_CANDIDATES)}; do",
        "    if [[ -d $dir && -w $dir ]]; then",
        f'        echo {_MARK} dir "$dir" "$(stat -f -c %T "$dir")"',
        "    fi",
        "done",
        "for c in apptainer singularity; do",
        f'    if command -v "$c" >/dev/null; then echo {_MARK} runtime "$c"; break; fi',
        "done",
        "if timeout 5 bash -c '</dev/tcp/pypi.org/443' 2>/dev/null; then",
        f"    echo {_MARK} internet yes",
        "else",
        f"    echo {_MARK} internet no",
        "fi",
    ]
    return "\n".join(lines) + "\n"


def parse_probe_job(output: str) -> ComputeNode:
    seen: dict[str, list[list[str]]] = {}
    for line in output.splitlines():
        if line.startswith(f"{_MARK} "):
            word, *rest = line.split()[1:]
            seen.setdefault(word, []).append(rest)
    local = lambda fs: not _SHARED_FILE_SYSTEMS.match(fs)  # noqa: E731
    per_job = sorted(
        (rest for rest in seen.get("jobdir", []) if len(rest) == 3 and local(rest[2])),
        key=lambda rest: (rest[0] != "SLURM_TMPDIR", rest[0] != "TMPDIR", rest[0]),
    )
    folders = [rest for rest in seen.get("dir", []) if len(rest) == 2 and local(rest[1])]
    if per_job:
        name, value, fs = per_job[0]
        scratch, scratch_seen = f"${name}", f"${name}={value} ({fs}), set per job"
    elif folders:
        scratch, scratch_seen = folders[0][0], f"{folders[0][0]} ({folders[0][1]}), node-local"
    else:
        scratch, scratch_seen = None, "no node-local folder but /tmp"
    internet = seen.get("internet", [[None]])[0][0]
    return ComputeNode(
        node=seen.get("node", [["?"]])[0][0],
        scratch=scratch,
        scratch_seen=scratch_seen,
        runtime=seen.get("runtime", [[None]])[0][0],
        internet=None if internet is None else internet == "yes",
    )


def run_probe_job(
    connection: ssh.Connection,
    partition: SeenPartition,
    flags: Sequence[str],
    *,
    wait_s: float = PROBE_JOB_WAIT_S,
    say: Callable[[str], None] = print,
) -> ComputeNode:
    """Submit the probe job, wait for it to end (cancelled if it has not within ``wait_s``, or on
    Ctrl-C), read what it printed and remove its files."""
    # The user's alone, as everything hpcbox makes under its root.
    connection.run(
        f"umask {PRIVATE.umask} && mkdir -p {shlex.quote(PROBE_JOB_DIR)}",
        what=f"make {PROBE_JOB_DIR} on {connection.target.address}",
    )
    job_id = slurm.submit(connection, PROBE_JOB_DIR, "draft.sh", probe_job_script(partition, flags), ())
    output = f"{PROBE_JOB_DIR}/draft-{job_id}.out"
    say(f"hpcbox: probe job {job_id} on {partition.name} (one minute at most), waiting for it to end")

    def read() -> slurm.JobState:
        found = slurm.job_state(connection, job_id)
        if found is None:
            raise HpcboxError(f"probe job {job_id} is known to neither squeue nor sacct")
        return found

    def said(found: slurm.JobState) -> None:
        if not found.finished:
            why = f" ({found.reason})" if found.reason not in ("", "None") else ""
            say(f"hpcbox: probe job {job_id}: {found.state}{why}")

    try:
        found = slurm.poll(read, job_id, timeout_s=wait_s, on_change=said)
    except BaseException as exc:  # given up on, Ctrl-C, or a connection lost: the job goes too
        connection.run(["scancel", job_id], what=f"cancel probe job {job_id}", check=False)
        if isinstance(exc, HpcboxError):
            raise HpcboxError(
                f"probe job {job_id} cancelled: {exc.message}",
                "try again when the queue is shorter, or draft without --probe-job",
            ) from exc
        raise
    if found.state != "COMPLETED":
        raise HpcboxError(f"probe job {job_id} ended {found.state}, not COMPLETED (its log: {output})")
    printed = connection.run(["cat", output], what=f"read probe job {job_id}'s output").stdout
    connection.run(
        ["rm", "-f", output, f"{PROBE_JOB_DIR}/scripts/draft.sh"], what="remove the probe job's files"
    )
    return parse_probe_job(printed)


@dataclass(frozen=True)
class Draft:
    text: str
    partitions: tuple[str, ...]
    left_out: tuple[str, ...]  # having no nodes
    closed: tuple[str, ...]  # left out for access lists that may keep the user out
    unknown: tuple[str, ...]  # top-level and partition facts not seen
    assumed: tuple[str, ...]


def compose(
    target: ssh.Target,
    site: Site,
    partitions: Sequence[SeenPartition],
    left_out: Sequence[SeenPartition],
    found: Rules,
    node: ComputeNode | None,
    *,
    today: str,
) -> Draft:
    """The profile's TOML, each fact with where it came from."""
    assumed: list[str] = []
    unknown: list[str] = []
    out = [
        f"# Drafted by `hpcbox profile.draft` from {target.address} on {today}, Slurm {site.slurm_version}"
        + (f", with a probe job on {node.node}." if node else "."),
        "# Set below: what the site reported. In `unknown`: what it could not tell, which hpcbox neither",
        "# checks nor renders. In `assumed`: settings given a generic value, which every job script names.",
        "# No Slurm reports a site's conventions: [gpus] request, [apptainer] options, binds,",
        "# workdir_on_scratch and sif_on_scratch, a partition's implicit and default_gpu_type, and its",
        "# preemptible where scontrol does not show it. They keep hpcbox's defaults here: set them as the",
        "# site's documentation says.",
        f"description = {toml_value(f'drafted from {target.host}')}",
        'scheduler = "slurm"',
    ]
    if node is not None and node.internet is not None:
        reached = "reached" if node.internet else "did not reach"
        out.append(f"compute_internet = {toml_value(node.internet)}  # the probe job {reached} pypi.org:443")
    else:
        unknown.append("compute_internet")
    runtime = (node.runtime if node else None) or site.runtime
    setup: list[str] = []
    if runtime is None and site.runtime_module:
        runtime, setup = site.runtime_module, [f"module load {site.runtime_module}"]
    if runtime is None:
        assumed.append("apptainer.command")
    elif site.modules and not setup:
        # On PATH in a login shell of a site with modules: whether a job's shell has it too is unseen.
        assumed.append("apptainer.setup")
    scratch = node.scratch if node else None
    if scratch is None:
        assumed.append("storage.node_scratch")
    if found.account_required is None:
        assumed += ["accounting.account_required", "accounting.qos_required"]
    if found.gpu_type_required is None:
        assumed.append("gpus.type_required")
    if unknown:
        out.append(f"unknown = {toml_value(unknown)}")
    if assumed:
        out.append(f"assumed = {toml_value(assumed)}")
    out += ["", "[login]", f"host = {toml_value(target.host)}"]
    out += [f"port = {target.port}"] if target.port else []
    out += [f"user = {toml_value(target.user)}"] if target.user else []
    out += ["", "[slurm]", f"version = {toml_value(site.slurm_version)}  # sinfo --version"]
    out += ["", "[gpus]", 'request = "gres"  # a convention: --gres=gpu:[TYPE:]N, which every Slurm takes']
    out += [f"# {line}" for line in found.said if "gres=gpu" in line]
    out.append(f"type_required = {toml_value(bool(found.gpu_type_required))}")
    out += ["", "[accounting]"]
    out += [f"# {line}" for line in found.said if "gres=gpu" not in line]
    out.append(f"account_required = {toml_value(bool(found.account_required))}")
    out.append(f"qos_required = {toml_value(bool(found.qos_required))}")
    if site.accounts:
        out.append(
            "# Yours when drafted (sacctmgr show assoc): take the line out to let jobs name any account."
        )
        out.append(f"accounts = {toml_value(list(site.accounts))}")
    if site.qos:
        out.append(f"# Your QOS there: {', '.join(site.qos)}.")
    out += ["", "[storage]"]
    if node is not None:
        out.append(f"# The probe job saw {node.scratch_seen}.")
    out.append(f"node_scratch = {toml_value(scratch or '/tmp')}")
    for key, value in site.areas.items():
        out.append(f"{key} = {toml_value(value)}  # set by the login shell")
    out += ["", "[apptainer]"]
    if runtime is None:
        out.append("# No apptainer or singularity on PATH or as a module on the login node.")
    else:
        where = "the probe job's node and the login node" if node and node.runtime else "the login node"
        how = f"module {site.runtime_module}" if setup else (site.runtime_seen or "on PATH")
        out.append(f"# Seen on {where}: {how}.")
    out.append(f"command = {toml_value(runtime or 'apptainer')}")
    out.append(f"setup = {toml_value(setup)}")
    out.append(
        "# Whether it mounts a SIF (FUSE) is each job's to find out; `hpcbox doctor` tries each compression."
    )
    drafted_unknown: list[str] = list(unknown)
    for partition in partitions:
        lines, facts_unknown = _partition_lines(partition)
        out += ["", "[[partitions]]", *lines]
        drafted_unknown += [f"partitions.{partition.name}.{fact}" for fact in facts_unknown]
    if left_out:
        out.append("")
    empty = [p.name for p in left_out if p.nodes == 0]
    if empty:
        out.append(f"# Left out, having no nodes: {', '.join(empty)}.")
    shut = [p for p in left_out if p.nodes > 0]
    if shut:
        out.append("# Left out, as their access lists may keep you out (name yours with --partitions):")
        out += [f"#   {p.name}: {'; '.join(closed(p, site))}" for p in shut]
    return Draft(
        text="\n".join(out) + "\n",
        partitions=tuple(p.name for p in partitions),
        left_out=tuple(empty),
        closed=tuple(p.name for p in shut),
        unknown=tuple(drafted_unknown),
        assumed=tuple(assumed),
    )


def _partition_lines(partition: SeenPartition) -> tuple[list[str], list[str]]:
    """A partition's lines in the profile, and the facts among them not seen (its `unknown`)."""
    lines = [f"name = {toml_value(partition.name)}"]
    lines += ["default = true"] if partition.default else []  # none: jobs name the first
    lines.append(f"max_time = {toml_value(partition.max_time or 'UNLIMITED')}")
    unknown: list[str] = []
    gpus, types = partition.gpus_per_node, partition.gpu_types
    if gpus is None:
        unknown.append("gpus_per_node")
    else:
        tres = f"  # scontrol's TRES: gres/gpu={gpus} on its one node" if partition.gres is None else ""
        lines.append(f"gpus_per_node = {gpus}{tres}")
    if types is None:
        unknown.append("gpu_types")
    else:
        lines.append(f"gpu_types = {toml_value(list(types))}")
    if partition.qos:
        lines.append(f"qos = {toml_value(partition.qos)}")
    if partition.preemptible:
        grace = f", GraceTime={partition.grace_time_s}" if partition.grace_time_s else ""
        lines.append(
            f"preemptible = true  # PreemptMode={partition.preempt_mode}{grace}; partitions of a higher "
            f"PriorityTier on its nodes: {', '.join(partition.outranked_by)}"
        )
    unknown.append("cpus_per_gpu")  # Slurm does not publish it per partition
    lines.append(f"unknown = {toml_value(unknown)}")
    lines.append(f"notes = {toml_value('; '.join(_notes(partition)))}")
    return lines, unknown


def _notes(partition: SeenPartition) -> list[str]:
    """What people drafting the profile should know of a partition, as the site printed it."""
    nodes = f"{partition.nodes} node{'s' if partition.nodes != 1 else ''}"
    notes = [f"{nodes}, {partition.state}"]
    if partition.gres is None:
        notes.append("gres not seen")
        if partition.gpus_in_tres is not None:
            total, count = f"TRES gres/gpu={partition.gpus_in_tres}", partition.nodes
            notes.append(
                f"{total} on its one node, types not seen"
                if count == 1
                else f"{total} on its {count} nodes, how many on each and types not seen"
            )
    else:
        notes.append(f"gres {', '.join(dict.fromkeys(partition.gres)) or 'none'}")
    if partition.mig_types:
        notes.append(f"MIG slices, each counted as a GPU: {', '.join(partition.mig_types)}")
    notes += [str(access) for access in partition.access]
    if partition.preempts and not partition.outranked_by:
        # The cluster's PreemptMode, which preemption by QOS (PreemptType=preempt/qos) may use: unseen.
        notes.append(
            f"PreemptMode={partition.preempt_mode} with no partition of a higher PriorityTier on its nodes: "
            "preempted only if the site preempts by QOS"
        )
    return notes


def check_output(path: Path) -> str:
    """The profile name ``path`` gives; a path that would overwrite or could not be a profile is refused."""
    if path.suffix != ".toml" or not NAME.match(path.stem):
        raise FieldError(
            "output", f"{str(path)!r} is not a profile file name", "name it NAME.toml: NAME becomes --cluster"
        )
    if path.exists():
        raise FieldError(
            "output", f"{path} exists", "pick another name, or remove it first (nothing is overwritten)"
        )
    if not path.parent.is_dir():
        raise FieldError(
            "output", f"{path.parent} is not a folder", "make it first, or write the draft elsewhere"
        )
    return path.stem


def draft(
    target: ssh.Target,
    output: Path,
    *,
    probe_job: bool = False,
    partitions: Sequence[str] = (),
    say: Callable[[str], None] = print,
) -> Draft:
    """Draft ``output`` from the site at ``target``: its text is a valid profile, written only when
    everything asked for was seen."""
    name = check_output(output)
    with ssh.Connection(target) as connection:
        probed = ask(
            connection,
            probe_commands(),
            what=f"probe {target.address}",
            hint="check the host, your SSH key and ~/.ssh/config (hpcbox needs a shell there)",
        )
        site = read_site(probed, target.address)
        chosen, left_out = choose(site, partitions)
        found = rules(connection, site, chosen)
        node = run_probe_job(connection, _default(chosen), found.flags, say=say) if probe_job else None
    made = compose(target, site, chosen, left_out, found, node, today=datetime.now(UTC).date().isoformat())
    try:
        parse_profile(tomllib.loads(made.text), name=name, source=output)
    except (FieldError, tomllib.TOMLDecodeError) as exc:  # a site hpcbox cannot describe yet: say so
        raise HpcboxError(f"the draft of {target.address} is not a valid profile: {exc}") from exc
    if output.exists():
        raise FieldError("output", f"{output} appeared meanwhile", "nothing was overwritten; draft again")
    write_atomically(output, made.text, mode=0o644)
    return made
