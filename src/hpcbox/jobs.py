"""Submit a job and follow its life: the job ledger, status, logs, fetch, cancel.

`submit` takes the artifacts of the earlier stages (the environment's SIF, the code snapshot, the
dataset), ships what the cluster lacks, renders the job script with the shipped paths, and
`sbatch`es it. Every submitted job is recorded in the project's ledger, `.hpcbox/jobs/`, one JSON
file per job written atomically; the commands after submit find their job there.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hpcbox import logpaths, ship
from hpcbox.command import EXAMPLE_TRAINER, ContainerCommand, Steps
from hpcbox.compression import SifCompression
from hpcbox.config import ProjectConfig
from hpcbox.errors import HpcboxError
from hpcbox.image import ENVIRONMENT, Image, build_image, last_image
from hpcbox.profiles import ClusterProfile
from hpcbox.provenance import inputs_revision
from hpcbox.render import JobInputs, JobScript, render_sbatch
from hpcbox.resources import Resources
from hpcbox.sweep import Sweep
from hpcbox.tools import slurm, ssh
from hpcbox.units import FieldError

# How long `cancel` lets the job script copy its results back before it cancels outright.
CANCEL_GRACE_S = 120
_JOB_ID = re.compile(r"^\d+$")


@dataclass(frozen=True)
class JobRecord:
    """One submitted job, as the ledger keeps it. Remote paths are absolute on the cluster."""

    job_id: str
    cluster: str
    host: str
    submitted_at: str
    submit_dir: str
    script: str
    log: str
    run_dir: str
    sif: str
    sif_sha256: str
    image: str
    code_revision: str
    code_snapshot: str
    dataset_sha256: str
    resources: dict[str, Any]
    trainer_args: tuple[str, ...]
    sent: tuple[str, ...] = ()
    bytes_sent: int = 0
    timings_s: dict[str, float] = field(default_factory=dict)
    error_log: str | None = None  # stderr's own log, when the job has one
    via: str | None = None  # "local": the cluster's job rehearsed on the mini cluster shaped like it
    sweep: tuple[tuple[str, ...], ...] = ()  # a sweep's points: array task i ran with sweep[i]
    resubmits: str | None = None  # the sweep job whose failed tasks this one runs again

    @property
    def is_array(self) -> bool:
        return bool(self.resources.get("array"))

    @property
    def where(self) -> str:
        """The cluster as people and the ledger name it: `edi`, or `edi-via-local` for a rehearsal."""
        return self.cluster if self.via is None else f"{self.cluster}-via-{self.via}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> JobRecord:
        fields = json.loads(text)
        fields["trainer_args"] = tuple(fields["trainer_args"])
        fields["sent"] = tuple(fields.get("sent", ()))
        fields["sweep"] = tuple(tuple(point) for point in fields.get("sweep", ()))
        return cls(**fields)


class Ledger:
    """The project's submitted jobs: `<state>/jobs/<cluster>-<job id>.json`."""

    def __init__(self, project: ProjectConfig) -> None:
        self.directory = project.state_dir / "jobs"

    def path(self, where: str, job_id: str) -> Path:
        return self.directory / f"{where}-{job_id}.json"

    def add(self, record: JobRecord, script_text: str) -> Path:
        """Record the job (and a copy of its script beside it); a reader never sees half a file."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(record.where, record.job_id)
        for target, text in ((path.with_suffix(".sh"), script_text), (path, record.to_json())):
            partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
            partial.write_text(text)
            partial.replace(target)
        return path

    def all(self) -> list[JobRecord]:
        if not self.directory.is_dir():
            return []
        records = [JobRecord.from_json(p.read_text()) for p in self.directory.glob("*.json")]
        return sorted(records, key=lambda record: (record.submitted_at, int(record.job_id)))

    def find(self, job_id: str | None = None, cluster: str | None = None) -> JobRecord:
        """The job ``job_id`` (the last submitted when None), on ``cluster`` when given."""
        if job_id is not None and not _JOB_ID.match(job_id):
            raise HpcboxError(f"job: {job_id!r} is not a job id", "job ids are numbers, e.g. 1234")
        records = [
            record
            for record in self.all()
            if cluster in (None, record.cluster, record.where) and job_id in (None, record.job_id)
        ]
        if not records:
            where = f" on cluster {cluster}" if cluster else ""
            raise HpcboxError(
                f"job {job_id}{where} was not submitted from this project"
                if job_id
                else f"no job was submitted{where}",
                "`hpcbox jobs` lists the jobs hpcbox submitted from here; `hpcbox submit` starts one",
            )
        if job_id is not None and len({record.where for record in records}) > 1:
            clusters = ", ".join(sorted({record.where for record in records}))
            raise HpcboxError(f"job {job_id} exists on several clusters ({clusters})", "add --cluster=NAME")
        return records[-1]


def require_slurm(profile: ClusterProfile) -> None:
    """Submitting, and everything after it, speaks Slurm (sbatch, squeue, sacct, srun) to the cluster."""
    if profile.lsf:
        raise HpcboxError(
            f"{profile.name} uses LSF: hpcbox renders its bsub script "
            f"(hpcbox sbatch --cluster={profile.name}) but cannot submit to it yet"
        )


def connection_target(
    profile: ClusterProfile,
    project: ProjectConfig,
    *,
    via: str | None = None,
    host: str | None = None,
    user: str | None = None,
    port: int | None = None,
) -> ssh.Target:
    """How to reach ``profile``'s login node: flags over the profile; ~/.ssh/config fills the rest.

    `local`, and any cluster ``via`` "local", is the mini cluster this checkout brought up (`invoke
    cluster.up`), reached with the keys generated for it; HPCBOX_MINICLUSTER /
    HPCBOX_MINICLUSTER_STATE name another one. It must be shaped like ``profile`` (`--like`).
    """
    if via not in (None, "local"):
        raise FieldError(
            "via", f"{via!r} is not a place to rehearse a job", "use --via local (the mini cluster)"
        )
    if via == "local" or (profile.name == "local" and host is None):
        return _mini_cluster(profile, project).ssh_target()
    login = profile.login
    # Port 22 is ssh's own default: leave it out so that a Port in ~/.ssh/config still applies.
    default_port = login.port if login.port != 22 else None
    return ssh.Target(host or login.host, port or default_port, user or login.user)


def _mini_cluster(profile: ClusterProfile, project: ProjectConfig):
    from hpcbox import minicluster
    from hpcbox.minicluster.spec import DEFAULT_NAME, state_root

    name = os.environ.get("HPCBOX_MINICLUSTER", DEFAULT_NAME)
    running = minicluster.find(name, state_root(project.state_dir))
    like = "" if profile.name == "local" else f" --like {profile.name}"
    if running is None:
        raise HpcboxError(
            f"the mini cluster {name} is not up",
            f"start it with `hpcbox cluster.up{like}` (or run `hpcbox demo`)",
        )
    if running.spec.like != profile.name:
        raise HpcboxError(
            f"the mini cluster {name} is shaped like {running.spec.like!r}, not {profile.name!r}",
            f"reshape it with `hpcbox cluster.up{like}`",
        )
    return running


def prepare_payload(
    project: ProjectConfig,
    data: Path,
    compression: SifCompression,
    *,
    flavour: str | None = None,
    offline: bool = False,
    cache: Path | None = None,
    data_cache: Path | None = None,
    say: Callable[[str], None] = print,
    on_line: Callable[[str], None] | None = None,
) -> tuple[ship.Payload, Image]:
    """The earlier stages, each a no-op when nothing changed: the environment image (the project's
    image without its code), its SIF at ``compression`` (what the target cluster reads), the code
    snapshot and the dataset's digest (a dataset directory's archive first, made once).

    The flavour and base are those `hpcbox build` last used, unless given. ``cache``: the SIF cache
    (default: $HPCBOX_CACHE/sif, else the project's .hpcbox/sif); ``data_cache``: the dataset
    directories' archives (default: $HPCBOX_CACHE/data, else the project's .hpcbox/data).
    """
    from hpcbox.datadir import cache_dir
    from hpcbox.sif import build_sif

    # Bad input first, before anything is built.
    dataset = ship.dataset(data, data_cache or cache_dir(project.root), say)
    code = ship.code_snapshot(project)
    base = None
    if flavour is None and not offline:
        try:
            recorded = last_image(project)
        except HpcboxError:
            recorded = None
        if recorded is not None:
            flavour, base = recorded.flavour, recorded.base
    environment = build_image(
        project, flavour=flavour, offline=offline, base=base, target=ENVIRONMENT, say=say, on_line=on_line
    )
    sif = build_sif(environment, compression=compression, cache=cache, say=say, on_line=on_line)
    payload = ship.Payload(sif.path, sif.sha256, sif.size, code, dataset)
    return payload, environment


def submit(
    project: ProjectConfig,
    profile: ClusterProfile,
    target: ssh.Target,
    resources: Resources,
    trainer_args: tuple[str, ...],
    payload: ship.Payload,
    *,
    image: str,
    via: str | None = None,
    remote_root: str = ship.DEFAULT_REMOTE_ROOT,
    dry_run: bool = False,
    sweep: Sweep | None = None,
    resubmits: str | None = None,
    say: Callable[[str], None] = print,
) -> JobRecord | None:
    """Ship, render, sbatch and record the job; with ``dry_run`` say what would happen and do nothing.

    With a ``sweep`` the job is an array, a task per point (``resources.array`` names which)."""
    require_slurm(profile)
    started = time.monotonic()
    with ssh.Connection(target) as connection:
        connected = time.monotonic()
        remote = ship.ship(connection, payload, project.name, root=remote_root, dry_run=dry_run, say=say)
        shipped = time.monotonic()
        inputs = JobInputs(
            sif=remote.sif,
            code_dir=remote.code_dir,
            dataset=remote.dataset,
            runs_dir="runs",
            log_dir="logs",
            sif_sha256=payload.sif_sha256,
            code_revision=inputs_revision(project.root, project.code),
        )
        script = render_sbatch(profile, resources, inputs, trainer_args, project.run, sweep=sweep)
        stamp = datetime.now(UTC)
        script_name = f"{_slug(resources.job_name)}-{stamp:%Y%m%dT%H%M%S}-{payload.code.name[:8]}.sh"
        if dry_run:
            say(f"hpcbox: would run `sbatch --parsable scripts/{script_name}` in {remote.submit_dir}:")
            say(script.text)
            return None
        job_id = slurm.submit(
            connection,
            remote.submit_dir,
            script_name,
            script.text,
            script.directories_to_create,
            unset=script.overriding_environment,
        )
        user = ""
        if any("%u" in pattern for pattern in script.log_patterns if pattern):
            user = connection.run(["id", "-un"], what="ask the cluster for your user name").stdout.strip()
    timings = {
        "connect": round(connected - started, 3),
        "ship": round(shipped - connected, 3),
        "sbatch": round(time.monotonic() - shipped, 3),
    }
    record = _record(
        profile, remote, script, script_name, job_id, user, stamp, payload, image, trainer_args, timings
    )
    record = replace(record, via=via, sweep=sweep.points if sweep else (), resubmits=resubmits)
    Ledger(project).add(record, script.text)
    return record


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "job"


def _record(
    profile: ClusterProfile,
    remote: ship.Remote,
    script: JobScript,
    script_name: str,
    job_id: str,
    user: str,
    stamp: datetime,
    payload: ship.Payload,
    image: str,
    trainer_args: tuple[str, ...],
    timings: dict[str, float],
) -> JobRecord:
    log, error_log = log_paths(script, remote.submit_dir, job_id, user)
    resources = asdict(script.resources)
    return JobRecord(
        job_id=job_id,
        cluster=profile.name,
        host=remote.host,
        submitted_at=stamp.isoformat(timespec="seconds"),
        submit_dir=remote.submit_dir,
        script=f"{remote.submit_dir}/scripts/{script_name}",
        log=log,
        run_dir=f"{remote.submit_dir}/{script.inputs.runs_dir}/{job_id}",
        sif=remote.sif,
        sif_sha256=payload.sif_sha256,
        image=image,
        code_revision=script.inputs.code_revision or "unknown",
        code_snapshot=payload.code.digest,
        dataset_sha256=payload.dataset.sha256,
        resources=json.loads(json.dumps(resources, default=str)),
        trainer_args=trainer_args,
        sent=remote.sent,
        bytes_sent=remote.bytes_sent,
        timings_s=timings,
        error_log=error_log,
    )


def log_paths(script: JobScript, submit_dir: str, job_id: str, user: str) -> tuple[str, str | None]:
    """Where job ``job_id`` of ``user`` writes its log and its stderr's own log (None: none), on the
    cluster; an array task's id is `*`."""

    def on_cluster(pattern: str) -> str:
        path = logpaths.expand(pattern, job_id=job_id, job_name=script.resources.job_name, user=user)
        return path if path.startswith("/") else f"{submit_dir}/{path}"

    output, error = script.log_patterns
    return on_cluster(output), on_cluster(error) if error else None


def state(connection: ssh.Connection, record: JobRecord) -> slurm.JobState:
    """The job's state; an array's is its tasks' together: running while any runs, pending while any
    waits, else COMPLETED when all did, else the state of the first that did not."""
    found = array_state(task_states(connection, record)) if record.is_array else None
    found = found or slurm.job_state(connection, record.job_id)
    if found is None:
        raise HpcboxError(
            f"job {record.job_id} is known to neither squeue nor sacct on {record.cluster}",
            "Slurm forgets finished jobs after a while where accounting is off; its results may still be "
            f"in {record.run_dir} (`hpcbox fetch -j {record.job_id}`)",
        )
    return found


def task_states(connection: ssh.Connection, record: JobRecord) -> dict[int, slurm.JobState]:
    return slurm.task_states(connection, record.job_id)


def array_state(tasks: dict[int, slurm.JobState]) -> slurm.JobState | None:
    if not tasks:
        return None
    first = next(iter(tasks.values()))
    job_id = first.job_id.rpartition("_")[0]
    for waiting in ("RUNNING", "PENDING"):
        if any(task.state == waiting for task in tasks.values()):
            return slurm.JobState(job_id, waiting, source="array")
    unfinished = [task for task in tasks.values() if not task.finished]
    if unfinished:
        return slurm.JobState(job_id, unfinished[0].state, source="array")
    failed = [task for task in tasks.values() if task.state != "COMPLETED"]
    return slurm.JobState(
        job_id, failed[0].state if failed else "COMPLETED", exit_code=failed[0].exit_code if failed else "0:0"
    )


def describe_tasks(record: JobRecord, tasks: dict[int, slurm.JobState]) -> list[str]:
    """The array's tasks for people: how many are in each state, then one line per task (its point)."""
    counts: dict[str, int] = {}
    for task in tasks.values():
        counts[task.state] = counts.get(task.state, 0) + 1
    summary = ", ".join(f"{count} {name}" for name, count in sorted(counts.items()))
    lines = [f"job {record.job_id}: {len(tasks)} array tasks: {summary}"]
    for index, task in tasks.items():
        point = record.sweep[index] if index < len(record.sweep) else ()
        lines.append("  " + describe(task) + (f" ({shlex.join(point)})" if point else ""))
    return lines


def sweep_of(record: JobRecord) -> Sweep:
    """The sweep a job ran, as its record keeps it (its throttle from the array's %N)."""
    _, percent, throttle = str(record.resources.get("array") or "").partition("%")
    return Sweep(f"job {record.job_id}'s sweep", record.sweep, int(throttle) if percent else None)


def failed_tasks(connection: ssh.Connection, record: JobRecord) -> tuple[int, ...]:
    """The tasks of a finished sweep that did not complete (failed, timed out, cancelled, out of
    memory, lost with their node): what `submit --resubmit-failed` runs again."""
    if not record.sweep:
        raise HpcboxError(
            f"job {record.job_id} is not a sweep",
            "--resubmit-failed reruns the failed points of a --sweep job",
        )
    tasks = task_states(connection, record)
    running = [index for index, task in tasks.items() if not task.finished]
    if running:
        raise HpcboxError(
            f"job {record.job_id} still has {len(running)} tasks pending or running",
            f"wait until it ends (`hpcbox status -j {record.job_id}`), or cancel it",
        )
    return tuple(index for index, task in tasks.items() if task.state != "COMPLETED")


def describe(found: slurm.JobState) -> str:
    """One line for people: state, and what a pending reason means or how a finished job ended."""
    parts = [f"job {found.job_id}: {found.state}"]
    if found.state == "PENDING" and found.reason:
        words = found.reason_in_words
        parts.append(f"({found.reason}{': ' + words if words else ''})")
    if found.elapsed:
        parts.append(f"elapsed {found.elapsed}" + (f" of {found.time_limit}" if found.time_limit else ""))
    if found.nodes and found.state != "PENDING":
        parts.append(f"on {found.nodes}")
    if found.exit_code:
        parts.append(f"exit code {found.exit_code}")
    return ", ".join(parts)


def wait(
    connection: ssh.Connection,
    record: JobRecord,
    *,
    until: Callable[[slurm.JobState], bool] = lambda found: found.finished,
    timeout_s: float = 3600,
    poll_s: float = 2,
    on_change: Callable[[slurm.JobState], None] | None = None,
) -> slurm.JobState:
    """Poll the job until ``until`` holds (default: it finished), telling ``on_change`` each new state."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        found = state(connection, record)
        if on_change is not None and (found.state, found.reason) != last:
            on_change(found)
        last = (found.state, found.reason)
        if until(found):
            return found
        if time.monotonic() > deadline:
            raise HpcboxError(f"job {record.job_id} is still {found.state} after {timeout_s:.0f} s")
        time.sleep(poll_s)


def follow_command(record: JobRecord, follow: bool) -> str:
    """The remote shell command printing the job's logs, to the end of the job with ``follow``."""
    logs = _log_words(record)
    first = _glob_word(record.log)
    if not follow:
        return f"""
set --; for log in {logs}; do if test -f "$log"; then set -- "$@" "$log"; fi; done
if test $# -gt 0; then tail -n +1 -- "$@"; else echo 'hpcbox: no log yet at '{first} >&2; fi
"""
    finished = "|".join(sorted(slurm.FINISHED_STATES))
    job_state = f"squeue --noheader --states=all --jobs={record.job_id} --format=%T 2>/dev/null"
    # Until the job ends: wait for a log to appear, then tail them; a requeued job comes back to PENDING
    # and writes on in the same log, so only a finished state (or a job Slurm forgot) ends it. An array
    # has a line per task: it is over when none of them is in another state.
    return f"""
over() {{ ! {{ {job_state} | grep -qvxE '{finished}'; }}; }}
any_log() {{ for log in {logs}; do if test -f "$log"; then return 0; fi; done; return 1; }}
until any_log || over; do sleep 2; done
any_log || exit 0
tail -n +1 -F -- {logs} 2>/dev/null & tailer=$!
until over; do sleep 3; done
sleep 2; kill "$tailer"
"""


def _log_words(record: JobRecord) -> str:
    return " ".join(_glob_word(path) for path in (record.log, record.error_log) if path)


def _glob_word(path: str) -> str:
    """``path`` as a shell word: quoted, but for the `*` standing for an array task's id."""
    return "*".join(shlex.quote(part) for part in path.split("*"))


def logs(
    connection: ssh.Connection, record: JobRecord, *, follow: bool, on_line: Callable[[str], None]
) -> None:
    connection.stream(
        follow_command(record, follow), what=f"read the log of job {record.job_id}", on_line=on_line
    )


def local_run_dir(project: ProjectConfig, record: JobRecord) -> Path:
    return project.root / "runs" / record.where / record.job_id


def fetch(connection: ssh.Connection, project: ProjectConfig, record: JobRecord) -> tuple[Path, ssh.Transfer]:
    """The job's results and its log into runs/<cluster>/<job>/ here (rsync: resumable, incremental)."""
    local = local_run_dir(project, record)
    present = connection.run(
        f"test -d {shlex.quote(record.run_dir)} && echo yes || echo no", what="look for the job's results"
    )
    if present.stdout.strip() != "yes":
        raise HpcboxError(
            f"job {record.job_id} has no results in {record.run_dir} yet",
            "the job script copies them there when the trainer stops; `hpcbox status` tells where it is",
        )
    transfers = [connection.download(f"{record.run_dir}/", local)]
    listed = connection.run(
        f'for log in {_log_words(record)}; do if test -f "$log"; then printf "%s\\n" "$log"; fi; done',
        what="look for the job's logs",
    )
    transfers += [connection.download(log, local) for log in listed.stdout.splitlines() if log]
    return local, ssh.Transfer(sum(t.sent for t in transfers), sum(t.received for t in transfers))


def report(connection: ssh.Connection, project: ProjectConfig, record: JobRecord) -> tuple[str, Path]:
    """The efficiency report of a job (text) and its plot (PNG beside the fetched results).

    Fetches the results first (incremental), so the trainer's metrics and the GPU samples are read
    from the local copy; sacct gives the rest.
    """
    from hpcbox import report as efficiency

    found = state(connection, record)
    if found.state == "PENDING":
        raise HpcboxError(f"job {record.job_id} has not started yet", "`hpcbox status` says why it waits")
    local, _ = fetch(connection, project, record)
    rows = efficiency.parse_sacct(slurm.sacct_rows(connection, record.job_id, efficiency.SACCT_FIELDS))
    metrics = local / "metrics.jsonl"
    metrics_path = metrics if metrics.is_file() else None
    gpu_csv = local / "gpu-utilization.csv"
    gpu_path = gpu_csv if gpu_csv.is_file() else None
    try:
        built = efficiency.build_report(rows, metrics_path, gpu_path, _own_program(project.run))
    except ValueError as exc:
        raise HpcboxError(f"cannot report on job {record.job_id}: {exc}") from exc
    png = efficiency.plot_report(metrics_path, gpu_path, local / "report.png")
    return efficiency.format_report(built), png


def _own_program(run: ContainerCommand | Steps) -> str | None:
    """What the job runs, in words, where that is not the example trainer (which writes metrics.jsonl)."""
    commands = [step.command for step in run.steps] if isinstance(run, Steps) else [run]
    if any(command.kind == "module" and command.target == EXAMPLE_TRAINER.target for command in commands):
        return None
    return " then ".join(
        command.target if command.kind == "entry_point" else " ".join(command.program_words())
        for command in commands
    )


def cancel(
    connection: ssh.Connection,
    record: JobRecord,
    *,
    grace_s: float = CANCEL_GRACE_S,
    say: Callable[[str], None] = print,
) -> slurm.JobState:
    """Stop the job so that nothing it wrote is lost.

    A running job's batch shell alone gets TERM (a plain scancel's TERM also reaches the squashfuse
    process serving the SIF under unprivileged Apptainer, and the trainer dies before it can save):
    the script passes it to the trainer, which checkpoints; the script copies the results to shared
    storage, cleans node scratch and cancels its own job. Past ``grace_s``, a plain scancel.
    """
    found = state(connection, record)
    if found.finished:
        say(f"hpcbox: job {record.job_id} has already ended: {found.state}")
        return found
    if found.state != "RUNNING":
        slurm.cancel(connection, record.job_id)
    else:
        say(f"hpcbox: asking job {record.job_id} to save its results and stop")
        slurm.cancel(connection, record.job_id, batch_signal="TERM")
    try:
        return wait(connection, record, timeout_s=grace_s, poll_s=1)
    except HpcboxError:
        say(f"hpcbox: job {record.job_id} did not stop within {grace_s:.0f} s; cancelling it outright")
        slurm.cancel(connection, record.job_id)
        return wait(connection, record, timeout_s=60, poll_s=1)


def overview(project: ProjectConfig, cluster: str | None = None) -> list[str]:
    """A line per ledger entry with its live state, one connection per cluster."""
    from hpcbox.profiles import load_profile

    records = [record for record in Ledger(project).all() if cluster in (None, record.cluster, record.where)]
    described: dict[tuple[str, str], str] = {}
    for name in sorted({record.where for record in records}):
        mine = [record for record in records if record.where == name]
        try:
            target = connection_target(load_profile(mine[0].cluster), project, via=mine[0].via)
            with ssh.Connection(target) as connection:
                for record in mine:
                    described[name, record.job_id] = describe(state(connection, record))
        except HpcboxError as exc:
            for record in mine:
                described.setdefault(
                    (name, record.job_id), f"job {record.job_id}: state unknown ({exc.message})"
                )
    return [f"{r.submitted_at}  {r.where:<10} {described[r.where, r.job_id]}" for r in records]


def data_path(project: ProjectConfig, given: str | None) -> Path:
    """The dataset, an archive or a directory: ``given`` (relative to here), else `tool.hpcbox.data`
    (relative to the root)."""
    if given:
        return Path(given).expanduser().resolve()
    if project.data:
        return project.root / project.data
    raise HpcboxError(
        "data: no dataset given",
        'pass --data PATH (one archive, or a directory), or set data = "PATH" in [tool.hpcbox]',
    )


def shell(
    connection: ssh.Connection,
    profile: ClusterProfile,
    resources: Resources,
    record: JobRecord,
    command: str | None,
    on_line: Callable[[str], None],
) -> None:
    """An allocation on a compute node with the SIF and code of ``record`` (the last job there):
    `apptainer shell` on the user's terminal, or ``command`` with its output to ``on_line``."""
    from hpcbox.render import render_shell

    code_dir = f"{record.submit_dir}/code/{record.code_snapshot[:16]}"
    remote = render_shell(profile, resources, record.sif, code_dir, command)
    if command is None:
        connection.interactive(remote)
        return
    connection.stream(remote, what=f"run a command on a compute node of {record.cluster}", on_line=on_line)
