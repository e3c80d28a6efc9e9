"""The project's job ledger: every submitted job, one JSON file in `.hpcbox/jobs/`, written atomically;
the commands after submit find their job there."""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hpcbox.errors import FieldError, HpcboxError
from hpcbox.files import write_atomically
from hpcbox.project.config import ProjectConfig

_JOB_ID = re.compile(r"^\d+$")
_RUN_NAME = re.compile(r"^\d+-\d+$")  # the second job of an id here is `<id>-2`
_TASK = re.compile(r"^(\d+(?:-\d+)?)_(\d+)$")  # a sweep's task: `3_2`, `3-2_2`


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
    resumes: str | None = None  # the job (its run) whose results and checkpoints this one started from
    # The resource options it was submitted with, as given (by the option table's names; a sweep's
    # array is not one): a rerun of its failed points or a job resumed from it takes them. None: a
    # record from before they were kept.
    options: dict[str, Any] | None = None
    notebook: bool = False  # JupyterLab (`hpcbox notebook`), not the project's program
    # Which mini cluster it ran on (None: a site's login node): its name, and its incarnation (made at
    # each `up` that starts one), which tells this job from the same id's job on a cluster made since.
    mini_cluster: str | None = None
    incarnation: str | None = None
    # Its folder under runs/<where>/ here: the job id, or `<id>-<n>` where an earlier job of that id
    # holds that name (None: the job id, as every record before run names).
    run_name: str | None = None
    # One task of a sweep, as the commands about one job see it (`-j 3_2`; never written to the ledger).
    task: int | None = None
    # A job raced among clusters or accounts (`submit --cluster=a,b`): every entrant's job as
    # `WHERE job ID` (`entrants`, in the order given), the one kept, the first to start (`kept`), and
    # those cancelled (`cancelled`; a loser that had ended before is not).
    race: dict[str, Any] | None = None

    @property
    def is_array(self) -> bool:
        return bool(self.resources.get("array"))

    @property
    def array_ran(self) -> str:
        """The tasks its --array spec names, as written, without its throttle (`0-49` of `0-49%10`; a
        rerun of failed points: `3,7-9`); "" for a single job."""
        return str(self.resources.get("array") or "").partition("%")[0]

    @property
    def array_tasks(self) -> tuple[int, ...]:
        """The task ids `array_ran` names, in order; () for a single job, and for `*`: an array whose
        tasks are not known here (a task's look at its array, `jobs.follow`)."""
        if self.array_ran == "*":
            return ()
        tasks: list[int] = []
        for part in filter(None, self.array_ran.split(",")):
            first, _, last = part.partition("-")
            tasks += range(int(first), int(last or first) + 1)
        return tuple(tasks)

    @property
    def race_said(self) -> str:
        """What its race came to, in words (`hpcbox jobs`); "" for a job not raced."""
        if not self.race:
            return ""
        me, kept = f"{self.where} job {self.job_id}", self.race["kept"]
        others = len(self.race["entrants"]) - 1
        if kept == me:
            return f"raced against {others} other{'s' if others != 1 else ''}: kept, the first to start"
        if me in self.race.get("cancelled", ()):
            return f"raced: cancelled, {kept} started first"
        return f"raced: {kept} was kept; this one had ended before it was called off"

    @property
    def run(self) -> str:
        """Its name among this project's jobs at its cluster: its run folder's name (a sweep's task's:
        the sweep's, `_` and the task)."""
        base = self.run_name or self.job_id.partition("_")[0]
        return base if self.task is None else f"{base}_{self.task}"

    @property
    def run_folder(self) -> Path:
        """Its folder under runs/<where>/ (a sweep's task's: in the sweep's)."""
        base = Path(self.run_name or self.job_id.partition("_")[0])
        return base if self.task is None else base / str(self.task)

    def of_task(self, index: int) -> JobRecord:
        """Task ``index`` of this sweep, as the commands about one job see it: its id (`3_2`), its own
        log, run folder and arguments (the sweep's, then its point's), no array of its own."""
        if not self.sweep:
            raise HpcboxError(
                f"job: {self.run} is not a sweep: it has no task {index}", f"name it as {self.run}"
            )
        if index not in self.array_tasks:
            raise HpcboxError(
                f"job: sweep {self.run} ran tasks {self.array_ran}, not {index}",
                f"`hpcbox status -j {self.run}` lists them",
            )
        task = str(index)
        return replace(
            self, job_id=f"{self.job_id}_{task}", log=self.log.replace("*", task),
            error_log=self.error_log and self.error_log.replace("*", task), run_dir=f"{self.run_dir}/{task}",
            resources={**self.resources, "array": None}, sweep=(), task=index,
            trainer_args=(*self.trainer_args, *self.sweep[index]),
        )  # fmt: skip

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
    """The project's submitted jobs: `<state>/jobs/<cluster>-<run>.json` (the run: the job id, or
    `<id>-<n>` for a later job given an id an earlier one here had)."""

    def __init__(self, project: ProjectConfig) -> None:
        self.directory = project.jobs_dir
        self.runs_dir = project.runs_dir

    def path(self, where: str, run: str) -> Path:
        return self.directory / f"{where}-{run}.json"

    def run_name(self, where: str, job_id: str) -> str:
        """The run folder's name for a new job ``job_id`` at ``where``: its id, unless an earlier job
        here had that id (a mini cluster made again since, an id Slurm reused) and holds the name in
        the ledger or in runs/; then `<id>-2`, `-3`... whichever is free."""
        taken = {record.run for record in self.all() if record.where == where}
        name, n = job_id, 1
        while name in taken or (self.runs_dir / where / name).exists() or self.path(where, name).exists():
            n += 1
            name = f"{job_id}-{n}"
        return name

    def add(self, record: JobRecord, script_text: str) -> JobRecord:
        """Record the job (and a copy of its script beside it), named by its run (``run_name``), and
        return it as kept; a reader never sees half a file, and no other job's record is replaced."""
        path = self.path(record.where, record.run)
        if record.run_name is None or (
            path.exists() and JobRecord.from_json(path.read_text()).script != record.script
        ):
            record = replace(record, run_name=self.run_name(record.where, record.job_id))
            path = self.path(record.where, record.run)
        write_atomically(path.with_suffix(".sh"), script_text)
        write_atomically(path, record.to_json())
        return record

    def update(self, record: JobRecord) -> None:
        """Write ``record`` over its own entry (what became of it since it was added: a race's end)."""
        write_atomically(self.path(record.where, record.run), record.to_json())

    def all(self) -> list[JobRecord]:
        if not self.directory.is_dir():
            return []
        records = [JobRecord.from_json(p.read_text()) for p in self.directory.glob("*.json")]
        return sorted(records, key=lambda record: (record.submitted_at, int(record.job_id)))

    def find(self, job_id: str | None = None, cluster: str | None = None) -> JobRecord:
        """The job ``job_id`` (the last submitted when None), on ``cluster`` when given: the last one
        submitted with that id, or the one whose run is named so (`12-2`: the second job 12 here, and
        `12-1` the first, whose run is `12`); a sweep's task `12_3`."""
        if job_id is not None and (task := _TASK.match(job_id)):
            return self.find(task[1], cluster).of_task(int(task[2]))
        if job_id is not None and not (_JOB_ID.match(job_id) or _RUN_NAME.match(job_id)):
            raise HpcboxError(
                f"job: {job_id!r} is not a job id",
                "job ids are numbers, e.g. 1234, and a sweep's task 1234_5",
            )
        records = [
            record
            for record in self.on(cluster)
            if job_id
            in (
                None,
                record.job_id,
                record.run,
                *((f"{record.run}-1",) if record.run == record.job_id else ()),
            )
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

    def on(self, cluster: str | None) -> list[JobRecord]:
        """The jobs here on ``cluster`` (by its profile's name, or a rehearsal's `NAME-via-PLACE`), all
        where None; a cluster with none that names no profile is refused as the typo it likely is."""
        records = [record for record in self.all() if cluster in (None, record.cluster, record.where)]
        if cluster and not records:
            _refuse_unknown(cluster)
        return records

    def earlier(self, record: JobRecord) -> list[JobRecord]:
        """The jobs here at ``record``'s cluster that had its id before it (each with a run of its own)."""
        return [
            other
            for other in self.all()
            if other.where == record.where
            and other.job_id == record.job_id
            and other.run != record.run
            and other.submitted_at <= record.submitted_at
        ]


def _refuse_unknown(cluster: str) -> None:
    """A --cluster that names no profile (a rehearsal's `NAME-via-PLACE` by its NAME) is a typo more
    likely than a cluster with no jobs: said so, with the name it may have meant."""
    from hpcbox.render.profiles import available  # profiles are read only where a name is unknown

    profiles = available()
    name = cluster.partition("-via-")[0]
    if name in profiles:
        return
    close = difflib.get_close_matches(name, profiles, n=1)
    meant = f" (did you mean {close[0]}?)" if close else ""
    raise FieldError(
        "cluster",
        f"no profile named {name!r}{meant}",
        f"the clusters with profiles are: {', '.join(sorted(profiles))}",
    )
