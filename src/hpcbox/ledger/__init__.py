"""The project's job ledger: every submitted job, one JSON file in `.hpcbox/jobs/`, written atomically;
the commands after submit find their job there."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpcbox.errors import HpcboxError
from hpcbox.files import write_atomically
from hpcbox.project.config import ProjectConfig

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
    notebook: bool = False  # JupyterLab (`hpcbox notebook`), not the project's program

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
        self.directory = project.jobs_dir

    def path(self, where: str, job_id: str) -> Path:
        return self.directory / f"{where}-{job_id}.json"

    def add(self, record: JobRecord, script_text: str) -> Path:
        """Record the job (and a copy of its script beside it); a reader never sees half a file."""
        path = self.path(record.where, record.job_id)
        write_atomically(path.with_suffix(".sh"), script_text)
        write_atomically(path, record.to_json())
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
