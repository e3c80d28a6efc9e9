"""`hpcbox doctor --cluster=NAME`: the site as its login node reports it, against its profile.

One bash script goes to the login node over one SSH connection (as an argument: ssh reads no standard
input); one login shell there runs every probe at once under one deadline and prints what each saw
between markers, a probe that did not answer in time named as such; the checks
here read that and compare it with the profile. Each check is one line: a verdict, what was seen, and
where the site differs from the profile, the profile key to change or what to do. ``fails`` is what a
job would die of (the command then exits 1); ``differs`` is a fact the profile has wrong or does not
know; ``ok`` agrees. What only a compute node can tell (its FUSE, its scratch) is probed on the login
node and said so: login and compute nodes usually share their software, not always.

Then the login node runs a probe SIF of each compression hpcbox may ship (sif.probe: a few kilobytes,
made here once, kept there under its content address): whether the site's runtime mounts a SIF of the
profile's compression is known before a real one is built or uploaded. All of it goes through one SSH
connection, and all of it under one deadline (BOUND_S): whatever the login node does, the table comes by
then, what did not answer in time named as such.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hpcbox.errors import HpcboxError
from hpcbox.files import slug, write_atomically
from hpcbox.render.profiles import ClusterProfile
from hpcbox.sif import probe
from hpcbox.sif.compression import SifCompression, fastest
from hpcbox.store import PRIVATE
from hpcbox.store.ship import DEFAULT_REMOTE_ROOT
from hpcbox.tools import proc, slurm, ssh
from hpcbox.units import format_time, parse_time

# The doctor's promise: its table within BOUND_S of its start (its SSH connection), whatever the login node
# does: a login shell that never starts, an upload that stalls. Opening the connection, each SSH command
# and the making of the probe SIFs get the time left to one deadline _RESERVE_S before it, and are killed
# at it (the login shells by `timeout` there too); the reserve is for that kill and the table.
BOUND_S = 20
_RESERVE_S = 1
# The deadline of each round of probes on the login node (they run at once): the facts, then the probe
# SIFs. Beside them the command pays one SSH connection and one login shell a round, so however slow the
# site's accounting is, it takes the two deadlines and two login shells at most.
PROBE_DEADLINE_S = 5
# A probe SIF that does not mount is unpacked in its probe, after the mount failed: more than 5 s on a
# busy login node (seen under the test suite's three lanes on two cores).
SIF_DEADLINE_S = 8
_MARK = "@@hpcbox-probe"
_STARTED = f"{_MARK}-login-took"  # the script's first line, with the seconds the login shell took to start
# The job whose start the doctor asks Slurm to guess (`sbatch --test-only`, nothing submitted): an hour.
QUEUE_PROBE_MINUTES = 60
PROBE_SIFS = f"{DEFAULT_REMOTE_ROOT}/images/probe"  # under the login's home, named by content
# What Apptainer says when it runs a SIF it cannot mount by extracting it to a folder first, every time.
_EXTRACTED = "Converting SIF file to temporary sandbox"

OK, DIFFERS, FAILS = "ok", "differs", "fails"
LOGIN = "login"  # the topic of the one line where no login shell answered: the site was not checked
LESS_BUSY = "run the doctor again when the login node is less busy"
LOGIN_FIX = (
    "check ~/.bash_profile, ~/.bashrc and /etc/profile.d/ on the login node: a login shell waits there"
)


@dataclass(frozen=True)
class Finding:
    verdict: str  # OK, DIFFERS or FAILS
    topic: str
    seen: str
    fix: str = ""  # the profile key to change, or what to do

    def line(self) -> str:
        fix = f" -> {self.fix}" if self.fix else ""
        return f"{self.verdict:<8} {self.topic:<11} {self.seen}{fix}"


@dataclass(frozen=True)
class Probed:
    """What one probe printed, and its exit status (124, or 137 once killed: it ran past the deadline)."""

    output: str
    status: int

    @property
    def answered(self) -> bool:
        return self.status == 0

    @property
    def timed_out(self) -> bool:
        return self.status in (124, 137)

    @property
    def last_line(self) -> str:
        """What it said last, or why it said nothing: for a line of the table."""
        if self.timed_out:
            said = f" (it said: {self.output.splitlines()[-1]})" if self.output else ""
            return f"no answer by the probes' deadline{said}"
        if self.output:
            return self.output.splitlines()[-1]
        return "no output" if self.answered else f"exit status {self.status}"


NOT_RUN = Probed("", 127)  # a probe the script did not run or report


def probe_commands(profile: ClusterProfile, *, queue: bool = True) -> dict[str, str]:
    """The probes the login node runs for ``profile``: name -> bash; with ``queue``, Slurm's guess of an
    hour's job's start too (`sbatch --test-only`, which takes a job id of the site's for it)."""
    runtime, setup = _runtime_lines(profile)
    # Each area's free space, the line led by its key; the path is the profile's, variables expanded.
    areas = "\n".join(
        f'printf "%s " {key}; df -Pk "{_expanding(path)}" 2>&1 | tail -1'
        for key, path in sorted(profile.shared.items())
    )
    probes = {
        "slurm": "sinfo --version",
        "squeue": "squeue --me --noheader --format=%i",
        "sacct": "sacct -X --noheader --parsable2 --format=JobID --starttime=now-1days",
        "partitions": "sinfo --noheader --format='%P|%l|%G'",
        "associations": 'sacctmgr --noheader --parsable2 show assoc user="$USER" format=Account,QOS',
        "module": "type -t module",
        "runtime": f"{setup}\ncommand -v {runtime} && {runtime} --version",
        "userns": "cat /proc/sys/user/max_user_namespaces",
        "fuse": "test -r /dev/fuse -a -w /dev/fuse && echo usable\n"
        "command -v squashfuse_ll squashfuse || true",
        "setuid": f"{setup}\n"
        f'libexec=$({runtime} buildcfg 2>/dev/null | sed -n "s/^LIBEXECDIR=//p")\n'
        'test -n "$libexec" && find "$libexec" -name starter-suid -perm -4000 2>/dev/null | head -1',
        "areas": areas or ":",
        "quota": 'quota -s 2>/dev/null || lfs quota -h -u "$USER" "$HOME" 2>/dev/null',
        "machine": "uname -m",
        # By content, not name: an upload cut short (at the doctor's deadline) leaves part of one there.
        "probe_sifs": f"cd {PROBE_SIFS} 2>/dev/null && sha256sum -- *.sif 2>/dev/null || true",
    }
    if queue:
        probes["queue"] = f"sbatch {shlex.join(_queue_request(profile))} --wrap=true"
    return probes


def _queue_request(profile: ClusterProfile) -> list[str]:
    """`sbatch --test-only`'s flags for an hour's job in the profile's default partition (its QOS, and the
    first of the profile's accounts where it lists them), whose start Slurm then guesses."""
    partition = profile.default_partition
    flags = ["--test-only", f"--time={QUEUE_PROBE_MINUTES}", "--job-name=hpcbox-doctor"]
    flags += [] if partition.implicit else [f"--partition={partition.name}"]
    flags += [f"--qos={partition.qos}"] if partition.qos else []
    flags += [f"--account={profile.accounts[0]}"] if profile.accounts else []
    return flags


def _runtime_lines(profile: ClusterProfile) -> tuple[str, str]:
    """The profile's runtime command, quoted, and the bash of its setup (modules read unset variables)."""
    setup = "\n".join(["set +u", *profile.apptainer.setup]) if profile.apptainer.setup else ":"
    return shlex.quote(profile.apptainer.command), setup


def probing(
    probes: Mapping[str, str], *, deadline_s: int = PROBE_DEADLINE_S, within_s: int | None = None
) -> str:
    """The bash that runs every one of ``probes`` (name -> bash) at once, each in its own bash under
    `timeout` with the one deadline, then prints each one's output after a marker line naming it and
    its status after that (parse_probes reads them back). `ask` runs it in one login shell: a site's
    `module` is a function its login profile defines, and its functions are exported to the probes.

    Its first line says how long the login shell took to start. ``within_s``: the seconds the shell has
    in all, from its start; the probes' deadline is then what the start left of them, less 2 s for
    their kill and report, where that is less than ``deadline_s`` (with none left it exits 124)."""
    budget = (
        f"deadline={deadline_s}\n"
        if within_s is None
        else f"deadline=$(( {within_s} - SECONDS - 2 ))\n"
        f"if (( deadline > {deadline_s} )); then deadline={deadline_s}; fi\n"
        "if (( deadline < 1 )); then exit 124; fi\n"
    )
    started = "\n".join(
        f'( timeout -k 1 "$deadline" bash -c {shlex.quote(body)} >"$probes/{number}" 2>&1 </dev/null\n'
        f'  echo $? >"$probes/{number}.status" ) >/dev/null 2>&1 &'
        for number, body in enumerate(probes.values())
    )
    reported = "\n".join(
        f"echo {_MARK} {name}\n"
        f'cat "$probes/{number}"\n'
        f'echo {_MARK}-status "$(cat "$probes/{number}.status" 2>/dev/null || echo 124)"'
        for number, name in enumerate(probes)
    )
    return (
        f'echo {_STARTED} "$SECONDS"\n'
        f"{budget}"
        "probes=$(mktemp -d) || exit 1\n"
        "trap 'rm -rf \"$probes\"' EXIT\n"
        'while read -r _ _ function; do export -f "$function"; done < <(declare -F)\n'
        f"{started}\nwait\n{reported}\n"
    )


class Unanswered(HpcboxError):
    """No login shell answered by the connection's deadline; the message says how far it got."""


def ask(
    connection: ssh.Connection,
    probes: Mapping[str, str],
    *,
    what: str,
    hint: str = "",
    deadline_s: int = PROBE_DEADLINE_S,
) -> dict[str, Probed]:
    """Each of ``probes`` as the login node at the other end of ``connection`` answers it (NOT_RUN for
    one the script did not report), in one login shell, within ``deadline_s`` and a second more.

    Where the connection has a deadline, the login shell gets the time left to it (ended by `timeout`
    there, the ssh killed here at it): one that has not reported by then raises Unanswered."""
    left = connection.seconds_left()
    # A second short of the time left: `timeout` there kills the login shell before ssh is killed here.
    within = None if left is None else int(left) - 1
    if within is not None and within < 1:
        raise Unanswered("no time was left for a login shell")
    command = ["bash", "-lc", probing(probes, deadline_s=deadline_s, within_s=within)]
    if within is not None:
        command = ["timeout", "-k", "1", str(within), *command]
    started = time.monotonic()
    try:
        done = connection.run(command, what=what, hint=hint, check=False)
    except proc.TimedOut as late:
        raise Unanswered(_how_far(late.output, time.monotonic() - started)) from late
    found = parse_probes(done.stdout)
    if within is not None and done.returncode in (124, 137) and not found:
        raise Unanswered(_how_far(done.stdout, time.monotonic() - started))
    if done.returncode != 0 and not found:
        raise proc.failure(what, done.returncode, done.stderr or done.stdout, hint, done.argv)
    return {name: found.get(name, NOT_RUN) for name in probes}


def _how_far(said: str, seconds: float) -> str:
    """How far a login shell that did not report got, from what the probe script ``said``."""
    took = next((line.split()[-1] for line in said.splitlines() if line.startswith(f"{_STARTED} ")), None)
    if took is None:
        return f"the login shell did not start in {seconds:.0f} s"
    return f"the login shell took {took} s to start, and its probes did not report in {seconds:.0f} s"


# Where a probe SIF did not mount, its probe says so on a line of its own and unpacks it (exit 3 if that
# ran): one process per compression, not a mount and an unpack beside it, which doubled the load on the
# login node, and a busy one then answered none by the deadline.
_UNPACKING = "hpcbox-probe-unpacking"
_UNPACKED = 3


def sif_commands(profile: ClusterProfile, sifs: Mapping[SifCompression, str]) -> dict[str, str]:
    """The probes that run each probe SIF (``sifs``: compression -> its path on the site) as a job would:
    mounted, and where that fails, unpacked to a folder first (`build --sandbox`)."""
    runtime, setup = _runtime_lines(profile)
    probes = {}
    for compression, path in sifs.items():
        sif = shlex.quote(path)
        probes[f"sif:{compression.algorithm}"] = "\n".join(
            [
                setup,
                f"if {runtime} exec {sif} {probe.PROGRAM}; then exit 0; fi",
                f"echo {_UNPACKING}",
                "d=$(mktemp -d) && trap 'rm -rf \"$d\"' EXIT",
                f'{runtime} -s build --sandbox "$d/sif" {sif} && {runtime} -s exec "$d/sif" {probe.PROGRAM} '
                f"&& exit {_UNPACKED}",
                "exit 1",
            ]
        )
    return probes


def _expanding(path: str) -> str:
    """``path`` for the inside of double quotes: its $VARIABLES expand there, nothing else does."""
    return re.sub(r'([\\"`])', r"\\\1", path)


def parse_probes(text: str) -> dict[str, Probed]:
    """The probes' outputs and statuses, by name, from the script's output."""
    found: dict[str, Probed] = {}
    name, lines = None, []
    for line in text.splitlines():
        if line.startswith(f"{_MARK}-status ") and name is not None:
            found[name] = Probed("\n".join(lines).strip(), int(line.split()[-1]))
            name, lines = None, []
        elif line.startswith(f"{_MARK} "):
            name, lines = line.split(maxsplit=1)[1], []
        elif name is not None:
            lines.append(line)
    return found


def examine(
    connection: ssh.Connection, profile: ClusterProfile, *, say: Callable[[str], None] = print
) -> list[Finding]:
    """The findings for ``profile``'s site on the other end of ``connection``; one `login` line where no
    login shell answered by the connection's deadline."""
    try:
        probed = probes(connection, profile)
    except Unanswered as late:
        return [Finding(FAILS, LOGIN, f"no answer by the doctor's deadline: {late.message}", LOGIN_FIX)]
    return findings(profile, probed, sif=try_sifs(connection, profile, probed, say))


def probes(connection: ssh.Connection, profile: ClusterProfile, *, queue: bool = True) -> dict[str, Probed]:
    """What the login node says to the probes (the cheap part: no SIF is run); ``queue`` as
    `probe_commands`."""
    return ask(
        connection,
        probe_commands(profile, queue=queue),
        what=f"probe {connection.target.address}",
        hint="check the host, your SSH key and ~/.ssh/config (hpcbox doctor needs a shell there)",
    )


def try_sifs(
    connection: ssh.Connection,
    profile: ClusterProfile,
    probed: Mapping[str, Probed],
    say: Callable[[str], None],
) -> Finding | None:
    """The `sif` line: the probe SIFs run on the login node, uploaded first where it lacks them, or why
    none ran (not made, not sent or not run by the connection's deadline); None where the runtime line
    fails already."""
    if not probed.get("runtime", NOT_RUN).answered:
        return None  # nothing runs a SIF
    machine = probed.get("machine", NOT_RUN)
    if not machine.answered or machine.output not in probe.MACHINES:
        seen = f"no probe SIF for a {machine.output or 'machine uname -m does not name'}"
        return _untried(seen, "run it where Docker runs")
    wanted = [fastest(profile.apptainer.compression.algorithm), *probe.compressions()]
    again = "run the doctor again (what was made or sent is kept)"
    try:
        made = probe.probe_sifs(machine.output, wanted, say=say, timeout_s=connection.seconds_left())
    except proc.TimedOut:
        return _untried("the probe SIFs were not made here by the doctor's deadline", again)
    except HpcboxError as failed:
        return _untried(f"the probe SIFs could not be made here: {failed.message}", failed.hint)
    there = stored_sifs(probed.get("probe_sifs", Probed("", 0)))
    missing = [sif for sif in made if sif.name not in there]
    paths = {sif.compression: f"{PROBE_SIFS}/{sif.name}" for sif in made}
    try:
        if missing:
            # The user's alone, as everything hpcbox makes under its root.
            connection.run(
                f"umask {PRIVATE.umask} && mkdir -p {shlex.quote(PROBE_SIFS)}",
                what=f"make {PROBE_SIFS} on {connection.target.address}",
            )
            for sif in missing:
                connection.upload(sif.path, f"{PROBE_SIFS}/{sif.name}")
        tried = ask(
            connection,
            sif_commands(profile, paths),
            what=f"run the probe SIFs on {connection.target.address}",
            deadline_s=SIF_DEADLINE_S,
        )
    except proc.TimedOut:
        return _untried("no answer by the doctor's deadline: the probe SIFs were not sent in time", again)
    except Unanswered as late:
        return _untried(f"no answer by the doctor's deadline: {late.message}", LESS_BUSY)
    return sif_line(profile, tried)


def stored_sifs(listed: Probed) -> set[str]:
    """The probe SIFs the login node keeps whole (``listed``: `sha256sum` of each): their names."""
    pairs = (line.split() for line in listed.output.splitlines())
    return {pair[1] for pair in pairs if len(pair) == 2 and pair[1] == f"{pair[0]}.sif"}


def _untried(seen: str, fix: str) -> Finding:
    return Finding(DIFFERS, "sif", f"not tried: {seen}", fix)


def findings(
    profile: ClusterProfile, probed: Mapping[str, Probed], *, sif: Finding | None = None
) -> list[Finding]:
    """Every check, in the order the table shows them (``sif``: the probe SIFs' line, where they were
    tried)."""
    get = lambda name: probed.get(name, NOT_RUN)  # noqa: E731
    return [
        _slurm(profile, get("slurm")),
        _scheduler(get("squeue"), get("sacct")),
        *_partitions(profile, get("partitions")),
        _accounts(profile, get("associations")),
        _runtime(profile, get("runtime"), get("module")),
        _mounting(profile, get("userns"), get("fuse"), get("setuid")),
        *([sif] if sif is not None else []),
        *_areas(profile, get("areas")),
        _quota(get("quota")),
        *([_queue(profile, probed["queue"])] if "queue" in probed else []),
    ]


def _queue(profile: ClusterProfile, probed: Probed) -> Finding:
    job = f"an hour's job in {profile.default_partition.name}"
    guess = slurm.test_only_start(probed.output)
    if guess:
        return Finding(
            OK,
            "queue",
            f"{job}: Slurm guesses it starts at {guess} (from the queue as it stands, not a promise)",
        )
    return Finding(
        DIFFERS,
        "queue",
        f"{job}: `sbatch --test-only` gives no start ({probed.last_line})",
        "the partitions and accounts lines say what the site wants",
    )


def _slurm(profile: ClusterProfile, probed: Probed) -> Finding:
    version = probed.output.split()[-1] if probed.answered and probed.output else ""
    if not version:
        return Finding(
            FAILS,
            "slurm",
            f"`sinfo --version` named no release ({probed.last_line})",
            "is Slurm's client there?",
        )
    if profile.slurm_version and not version.startswith(profile.slurm_version):
        return Finding(DIFFERS, "slurm", f"Slurm {version}", f'[slurm] version = "{version}"')
    return Finding(
        OK, "slurm", f"Slurm {version}" + ("" if profile.slurm_version else " (the profile names none)")
    )


def _scheduler(squeue: Probed, sacct: Probed) -> Finding:
    if not squeue.answered:
        return Finding(FAILS, "scheduler", f"squeue does not answer ({squeue.last_line})", "ask the site")
    if not sacct.answered:
        return Finding(
            DIFFERS,
            "scheduler",
            f"squeue answers; sacct does not ({sacct.last_line})",
            "status reads squeue alone; report needs sacct",
        )
    return Finding(OK, "scheduler", "squeue and sacct answer (accounting on)")


def _sinfo_partitions(probed: Probed) -> dict[str, tuple[int | None, str, bool]]:
    """name -> (time limit in seconds or None, gres, default) from `sinfo --format=%P|%l|%G`."""
    seen: dict[str, tuple[int | None, str, bool]] = {}
    for line in probed.output.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 3:
            continue
        name, limit, gres = parts
        default = name.endswith("*")
        name = name.rstrip("*")
        seconds = None if limit.lower() in ("infinite", "unlimited", "n/a") else parse_time(limit, "sinfo")
        gres_before = seen.get(name, (None, "", False))[1]
        seen[name] = (
            seconds,
            ",".join(filter(None, (gres_before, gres if gres != "(null)" else ""))),
            default,
        )
    return seen


def _gpu_types(gres: str) -> set[str]:
    """The types in gres such as `gpu:a100:4(S:0-1),gpu:v100:2` (an untyped `gpu:4` has none)."""
    return {gpu_type for gpu_type, _ in slurm.gpu_gres(gres) if gpu_type}


def _partitions(profile: ClusterProfile, probed: Probed) -> list[Finding]:
    if not probed.answered:
        return [
            Finding(FAILS, "partitions", f"sinfo failed ({probed.last_line})", "is Slurm's client there?")
        ]
    seen = _sinfo_partitions(probed)
    # The Alliance's scheduler picks the partition (implicit): which one is the default is no fact there.
    routed = any(p.implicit for p in profile.partitions)
    out = []
    for index, partition in enumerate(profile.partitions):
        if partition.implicit:
            picked = f"{partition.name}: the scheduler picks among the {len(seen)} partitions here"
            out.append(Finding(OK, "partitions", picked))
            continue
        key = f"partitions[{index}]"
        if partition.name not in seen:
            out.append(
                Finding(
                    FAILS,
                    "partitions",
                    f"{partition.name}: not a partition here (sinfo has {', '.join(sorted(seen)) or 'none'})",
                    f"{key}.name",
                )
            )
            continue
        limit, gres, default = seen[partition.name]
        problems, fixes = [], []
        if partition.max_time_s is not None and partition.max_time_s != limit:
            shown = "none" if limit is None else format_time(limit)
            problems.append(f"time limit {shown}")
            fixes.append(f'{key}.max_time = "{shown if limit is not None else "UNLIMITED"}"')
        if partition.gpu_types is not None:
            absent = sorted(set(partition.gpu_types) - _gpu_types(gres))
            if absent:
                problems.append(f"no {', '.join(absent)} GPUs (gres {gres or 'none'})")
                fixes.append(f"{key}.gpu_types")
        if (partition is profile.default_partition) != default and not routed:
            problems.append("is the default" if default else "is not the default")
            fixes.append(f"{key}.default")
        if problems:
            out.append(
                Finding(DIFFERS, "partitions", f"{partition.name}: {'; '.join(problems)}", ", ".join(fixes))
            )
        else:
            shown = "no limit" if limit is None else format_time(limit)
            out.append(Finding(OK, "partitions", f"{partition.name}: {shown}, gres {gres or 'none'}"))
    return out


def _accounts(profile: ClusterProfile, probed: Probed) -> Finding:
    if not probed.answered:
        return Finding(DIFFERS, "accounts", f"sacctmgr does not answer ({probed.last_line})", "ask the site")
    rows = [line.split("|") for line in probed.output.splitlines() if "|" in line]
    accounts = sorted({row[0] for row in rows if row[0]})
    qos = sorted({q for row in rows for q in row[1].split(",") if len(row) > 1 and q})
    if not accounts:
        verdict = FAILS if profile.account_required else DIFFERS
        return Finding(verdict, "accounts", "you are in no account here", "ask the site for one")
    seen = f"yours: {', '.join(accounts)}" + (f"; QOS {', '.join(qos)}" if qos else "")
    if profile.accounts is not None and not set(accounts) <= set(profile.accounts):
        return Finding(DIFFERS, "accounts", seen, f"accounting.accounts = {list(accounts)}")
    return Finding(OK, "accounts", seen)


def _runtime(profile: ClusterProfile, probed: Probed, module: Probed) -> Finding:
    command = profile.apptainer.command
    if profile.apptainer.loads_modules and not module.answered:
        return Finding(
            FAILS, "runtime", "no `module` command here, which the profile's setup uses", "[apptainer] setup"
        )
    lines = probed.output.splitlines()
    if not probed.answered or not lines:
        after = " after the profile's setup" if profile.apptainer.setup else ""
        return Finding(FAILS, "runtime", f"`{command}` does not run{after}", "[apptainer] command, setup")
    path = next((line for line in lines if line.startswith("/")), command)
    return Finding(OK, "runtime", f"{lines[-1]} ({path})")


def _mounting(profile: ClusterProfile, userns: Probed, fuse: Probed, setuid: Probed) -> Finding:
    """Whether an ordinary user's runtime can mount a SIF here: setuid, or user namespaces with FUSE."""
    namespaces = userns.answered and userns.output.strip().isdigit() and int(userns.output.strip()) > 0
    lines = fuse.output.splitlines()
    fuse_usable = "usable" in lines
    squashfuse = next((line for line in lines if line.startswith("/")), "")
    suid = setuid.answered and bool(setuid.output.strip())
    where = " (on the login node)"
    if suid:
        return Finding(OK, "mounting", f"setuid runtime: mounts a SIF without FUSE{where}")
    if namespaces and fuse_usable and squashfuse:
        if profile.apptainer.fuse is False:
            return Finding(
                DIFFERS,
                "mounting",
                f"user namespaces, FUSE and {squashfuse}{where}",
                "[apptainer] fuse = true",
            )
        return Finding(OK, "mounting", f"user namespaces, FUSE and {squashfuse}{where}")
    missing = [
        what
        for what, there in (
            ("user namespaces", namespaces),
            ("FUSE", fuse_usable),
            ("squashfuse", squashfuse),
        )
        if not there
    ]
    seen = f"no {', '.join(missing)}{where}: jobs unpack the SIF to node scratch"
    if not namespaces:
        return Finding(
            FAILS,
            "mounting",
            f"no user namespaces and no setuid runtime{where}",
            "ask the site how to run Apptainer",
        )
    if profile.apptainer.fuse is not False:
        return Finding(DIFFERS, "mounting", seen, "[apptainer] fuse = false")
    return Finding(OK, "mounting", seen)


def _sif_outcome(probed: Mapping[str, Probed], algorithm: str) -> tuple[str, str]:
    """How a probe SIF of ``algorithm`` ran: "mounts", "extracts" (Apptainer extracted it to a folder
    to run it, as it does each time where it has no squashfuse), "unpacks" (it did not mount; unpacked
    first it ran), "fails" or "unanswered" (not by the deadline); and, where it did not mount, the
    runtime's reason."""
    tried = probed.get(f"sif:{algorithm}", NOT_RUN)
    if tried.answered:
        return ("extracts" if _EXTRACTED in tried.output else "mounts"), ""
    mounting, unpacking, _ = tried.output.partition(_UNPACKING)
    if not unpacking:
        # Stopped while mounting: a busy login node, not a runtime that cannot; nothing is known.
        return ("unanswered" if tried.timed_out else "fails"), tried.last_line
    said = [line for line in mounting.splitlines() if "FATAL" in line or "ERROR" in line]
    last = said[-1] if said else (mounting.strip().splitlines() or ["no reason given"])[-1]
    # Apptainer chains its reasons with ": "; the last is the cause (squashfuse's own words).
    reason = " ".join(last.split()).rsplit(": ", 1)[-1]
    if tried.status == _UNPACKED:
        return "unpacks", reason
    if tried.timed_out:
        return "fails", f"{reason} (unpacked, it did not run by the probes' deadline)"
    return "fails", reason


def sif_line(profile: ClusterProfile, probed: Mapping[str, Probed]) -> Finding:
    """Whether the site's runtime mounts a SIF of the compression the profile ships, as the probe SIFs
    (``probed``: `sif:<algorithm>` each) found. Where it does not and the profile does not say so
    (``fuse = false``), every job would unpack or extract the SIF on each of its nodes (minutes and
    gigabytes for a CUDA SIF): the line fails, with a compression that mounts where one does."""
    shipped = profile.apptainer.compression.algorithm
    outcomes = {
        algorithm: _sif_outcome(probed, algorithm)
        for algorithm in dict.fromkeys([shipped, *(c.algorithm for c in probe.compressions())])
    }
    outcome, reason = outcomes[shipped]
    others = [a for a, (o, _) in outcomes.items() if o == "mounts" and a != shipped]
    refused = [f"{a} does not: {r}" for a, (o, r) in outcomes.items() if o != "mounts" and a != shipped]
    mine = f"a {shipped} SIF (the profile's)"
    if outcome == "mounts":
        rest = [*([f"so do {', '.join(others)}"] if others else []), *refused]
        return Finding(OK, "sif", f"{mine} mounts on the login node" + "".join(f"; {part}" for part in rest))
    if outcome == "extracts":
        seen = f"{mine} runs on the login node only extracted to a temporary folder, each time"
        if profile.apptainer.fuse is False:
            return Finding(OK, "sif", f"{seen}: jobs unpack it once, as the profile says (fuse = false)")
        return Finding(FAILS, "sif", seen, "[apptainer] fuse = false: jobs unpack it once to node scratch")
    if outcome == "unanswered":
        return Finding(DIFFERS, "sif", f"{mine}: {reason}", LESS_BUSY)
    seen = f"{mine} does not mount on the login node: {reason}"
    if outcome == "unpacks" and profile.apptainer.fuse is False:
        return Finding(OK, "sif", f"{seen}; jobs unpack it, as the profile says (fuse = false)")
    if others:
        mounting = f"; {', '.join(others)} mount{'s' if len(others) == 1 else ''}"
        return Finding(FAILS, "sif", seen + mounting, f'[apptainer] compression = "{fastest(others[0])}"')
    if outcome == "unpacks":
        return Finding(FAILS, "sif", f"{seen}; unpacked it runs", "[apptainer] fuse = false")
    return Finding(FAILS, "sif", f"{seen}, nor runs unpacked", "ask the site how to run a SIF there")


def _areas(profile: ClusterProfile, probed: Probed) -> list[Finding]:
    free = {}
    for line in probed.output.splitlines():
        parts = line.split()
        # `<key> <filesystem> <blocks> <used> <available> <capacity> <mount>` from df -Pk (KiB)
        if len(parts) >= 7 and parts[4].isdigit():
            free[parts[0]] = int(parts[4]) * 1024
    out = []
    for key, path in sorted(profile.shared.items()):
        if key in free:
            out.append(Finding(OK, "storage", f"{key} {path}: {free[key] / 1e9:,.1f} GB free"))
        else:
            out.append(
                Finding(DIFFERS, "storage", f"{key} {path}: not there (or not set) here", f"[storage] {key}")
            )
    return out


def _quota(probed: Probed) -> Finding:
    if not probed.answered or not probed.output:
        return Finding(OK, "quota", "neither `quota` nor `lfs quota` answers: none known")
    return Finding(OK, "quota", " ".join(probed.output.split())[:160])


def render(profile: ClusterProfile, target: ssh.Target, found: list[Finding], seconds: float) -> str:
    """The table, under a line naming the site and the time taken, and a last line with the verdict."""
    failing = sum(finding.verdict == FAILS for finding in found)
    differing = sum(finding.verdict == DIFFERS for finding in found)
    verdict = (
        f"{failing} check{'s' if failing != 1 else ''} would fail a job" if failing else "a job would run"
    )
    if any(finding.topic == LOGIN for finding in found):
        verdict = "the site was not checked: no login shell answered by the doctor's deadline"
    elif differing:
        verdict += f"; {differing} line{'s' if differing != 1 else ''} where the profile differs"
    header = f"hpcbox doctor: {profile.name} at {target.address}, {seconds:.1f} s"
    return "\n".join([header, *(finding.line() for finding in found), verdict]) + "\n"


def failed(found: list[Finding]) -> bool:
    return any(finding.verdict == FAILS for finding in found)


def check(
    target: ssh.Target, profile: ClusterProfile, *, say: Callable[[str], None] = print
) -> tuple[str, bool]:
    """The doctor's table for ``profile`` at ``target``, and whether a job would fail there."""
    if profile.lsf:
        raise HpcboxError(f"{profile.name} uses LSF: hpcbox doctor speaks Slurm")
    started = time.monotonic()
    deadline = proc.Deadline(started + BOUND_S - _RESERVE_S)
    with ssh.Connection(target, deadline=deadline) as connection:
        found = examine(connection, profile, say=say)
    return render(profile, target, found, time.monotonic() - started), failed(found)


def first_look(
    connection: ssh.Connection,
    profile: ClusterProfile,
    state_dir: Path,
    *,
    say: Callable[[str], None] = print,
) -> list[Finding] | None:
    """What `submit` asks of a site the first time it submits there with this profile: the doctor's
    probe script alone (one round trip; no SIF is run, the job tries its own). Lines that are not ok are
    said, not enforced: the login node answers for the compute nodes, which may differ. The answer is
    remembered under ``state_dir`` for this profile (its content) and login, each pair in a file of its
    own: two logins of one profile (a race's two mini clusters) do not ask again by turns. None where it
    was already.
    """
    key = hashlib.sha256(
        f"{connection.target.address}\n{dataclasses.replace(profile, source=None)!r}".encode()
    ).hexdigest()
    remembered = state_dir / "doctor" / f"{slug(profile.name)}-{key[:16]}.json"
    try:
        if json.loads(remembered.read_text()).get("key") == key:
            return None
    except (OSError, ValueError, AttributeError):
        pass  # not asked yet, or a damaged file: ask
    # Not the queue's guess: its `sbatch --test-only` would take a job id, and the user submits one.
    found = findings(profile, probes(connection, profile, queue=False))
    flagged = [finding for finding in found if finding.verdict != OK]
    for finding in flagged:
        say(f"hpcbox: {finding.line()}")
    if flagged:
        say(
            f"hpcbox: the site differs from profile {profile.name} above (its login node says so; asked once "
            f"per profile and login): `hpcbox doctor --cluster={profile.name}` shows every check"
        )
    record = {"key": key, "address": connection.target.address, "lines": [f.line() for f in found]}
    write_atomically(remembered, json.dumps(record, indent=1) + "\n")
    return found
