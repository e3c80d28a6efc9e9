"""`hpcbox ci`: the project's job rehearsed as its CI runs it on every push (the script `hpcbox init --ci`
writes): the environment built, a mini cluster of the run's own shaped like `[tool.hpcbox.ci] cluster`,
the job submitted with the table's arguments and time limit, and a verdict: it ended COMPLETED and its
outputs came home, or one line saying which job and why not, after the end of its log. The cluster is
removed on every way out, Ctrl-C and a CI runner's SIGTERM included.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpcbox.errors import HpcboxError
from hpcbox.render.sbatch import OUTCOME_FILE, SUBMISSION_FILE
from hpcbox.testing import cluster as session

Say = Callable[[str], None]

CI_FOLDER = ".hpcbox/ci/last"  # under the project: git-ignored
LOG_TAIL_LINES = 30  # what a failed job's log shows above the verdict: its traceback, usually
# What the job script itself writes into a job's output folder (render/job.sh.in).
JOB_SCRIPT_OWN = ("gpu-utilization.csv", ".hpcbox-steps", OUTCOME_FILE, SUBMISSION_FILE)


@dataclass(frozen=True)
class Rehearsal:
    """A job that passed: its id on the run's cluster, how it ended, and the folder its outputs came to."""

    job_id: str
    description: str
    results: Path
    outputs: tuple[str, ...]


def rehearse(project_root: Path, *, say: Say) -> Rehearsal:
    """Run the project's CI job (`[tool.hpcbox.ci]`) on a mini cluster of its own: the job that passed,
    or HpcboxError naming the job and how it ended, its log's end in the details."""
    from hpcbox.api import Project, describe
    from hpcbox.project.config import load_project

    ci = load_project(project_root).ci
    settings = session.ClusterSettings(ci.cluster, ci.slurm).checked(
        profile_field="tool.hpcbox.ci.cluster", slurm_field="tool.hpcbox.ci.slurm"
    )
    say("hpcbox ci: building the environment (on the Debian base bootstrapped here: no registry)")
    Project(project_root, say=say).build(offline=True)  # a project that does not build starts no cluster
    # The last run's ledger and fetched results stay for a look (a CI artifact); its keys go with it.
    folder = project_root / CI_FOLDER
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with session.running(settings, project_root, folder, say=say) as cluster:
        started = time.monotonic()
        job = cluster.submit(list(ci.args), offline=True, time=ci.time)
        say(f"hpcbox ci: job {job.job_id} submitted ({' '.join(ci.args) or 'no arguments'}, time {ci.time})")
        ended = job.wait()
        said = describe(ended)
        say(f"hpcbox ci: {said}, {time.monotonic() - started:.0f} s after it was submitted")
        if ended.state != "COMPLETED":
            raise HpcboxError(
                f"the CI rehearsal (like {settings.profile}) failed: {said}",
                "its log's end is above; `hpcbox ci` runs the same here",
                details=_log_tail(job),
            )
        results = job.fetch()
        outputs = tuple(sorted(_outputs(results, job.record.log)))
        if not outputs:
            raise HpcboxError(
                f"job {job.job_id} of the CI rehearsal ended COMPLETED but wrote nothing to its output "
                "folder",
                "a job's results go to {output_dir} (its program's arguments name it)",
                details=_log_tail(job),
            )
    return Rehearsal(job.job_id, said, results, outputs)


def _log_tail(job) -> str:
    lines: list[str] = []
    try:
        job.logs(on_line=lines.append)
    except HpcboxError as exc:
        return f"(its log could not be read: {exc.message})"
    return "\n".join(lines[-LOG_TAIL_LINES:])


def _outputs(results: Path, log: str) -> list[str]:
    """The files the job's program wrote (relative to ``results``): not the Slurm log fetched beside
    them, nor what the job script keeps there (the GPU samples, the finished steps' markers)."""
    hpcbox_own = {log.rsplit("/", 1)[-1], *JOB_SCRIPT_OWN}
    return [
        relative.as_posix()
        for relative in (path.relative_to(results) for path in results.rglob("*") if path.is_file())
        if relative.parts[0] not in hpcbox_own
    ]
