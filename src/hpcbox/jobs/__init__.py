"""Submit a job and follow its life: ship what the cluster lacks, submit, the ledger, status, logs,
fetch, the efficiency report, cancel, and a shell beside it. The commands (hpcbox.cli) use the names
below; each module holds one part of the job's life."""

from hpcbox.jobs.connect import (
    Place,
    connection_target,
    on_mini_cluster,
    place_of,
    rehearse,
    require_slurm,
    running_mini_cluster,
    say_rehearsal_slurm,
)
from hpcbox.jobs.fetch import fetch, local_run_dir, report
from hpcbox.jobs.follow import (
    CANCEL_GRACE_S,
    array_state,
    cancel,
    describe,
    describe_tasks,
    failed_tasks,
    follow_command,
    logs,
    overview,
    state,
    sweep_of,
    task_states,
    wait,
)
from hpcbox.jobs.ledger import JobRecord, Ledger
from hpcbox.jobs.shell import shell
from hpcbox.jobs.submit import data_path, log_paths, prepare_payload, submit

__all__ = [
    "CANCEL_GRACE_S",
    "JobRecord",
    "Ledger",
    "Place",
    "array_state",
    "cancel",
    "connection_target",
    "data_path",
    "describe",
    "describe_tasks",
    "failed_tasks",
    "fetch",
    "follow_command",
    "local_run_dir",
    "log_paths",
    "logs",
    "on_mini_cluster",
    "overview",
    "place_of",
    "prepare_payload",
    "rehearse",
    "report",
    "require_slurm",
    "running_mini_cluster",
    "say_rehearsal_slurm",
    "shell",
    "state",
    "submit",
    "sweep_of",
    "task_states",
    "wait",
]
