"""Which job a ledger record is, beyond its id: Slurm numbers a fresh mini cluster's jobs from 1 again,
so a record names the mini cluster's incarnation it ran on (made at each `up` that starts one), and a
command about a job whose cluster has gone says so, and where its results are, instead of asking the
new cluster about its own job of that number.

The cluster's state folder lists the projects that submitted to it (`projects`), so that `cluster.down`
can name the jobs whose results would go with it, from whichever project it is run."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpcbox.errors import HpcboxError
from hpcbox.jobs.fetch import fetched, shown_run_dir
from hpcbox.ledger import JobRecord, Ledger
from hpcbox.minicluster.cluster import Cluster, find, removed_incarnations, shared_state
from hpcbox.project.config import ProjectConfig, load_project
from hpcbox.tools import ssh

PROJECTS = "projects"  # in the cluster's state folder: each project's root that submitted to it, a line


def note_project(cluster: Cluster, project: ProjectConfig) -> None:
    """Add ``project`` to the projects that submitted to ``cluster`` (once)."""
    listed = cluster.secrets.directory / PROJECTS
    root = str(project.root)
    known = listed.read_text().splitlines() if listed.is_file() else []
    if root not in known:
        with listed.open("a") as projects:
            projects.write(root + "\n")


def gone(record: JobRecord, project: ProjectConfig) -> str | None:
    """Where job ``record`` ran and where its results are, in a line, where the mini cluster it ran on
    has been removed (or made again) since; None where it still runs there (or ran at a site)."""
    if record.mini_cluster is None or record.incarnation is None:
        return None
    root = shared_state(record.mini_cluster, project.state_dir, say=_to_stderr)
    current = find(record.mini_cluster, root)
    if current is not None and current.incarnation.id == record.incarnation:
        return None
    past = removed_incarnations(root, record.mini_cluster).get(record.incarnation)
    life = f"as {past}" if past is not None else "in an earlier life of it"
    results = (
        f"its results were fetched to {shown_run_dir(project, record)}"
        if fetched(project, record)
        else "its results were never fetched and went with it"
    )
    return f"job {record.run} ran on mini cluster {record.mini_cluster} {life}; {results}"


def check_reachable(record: JobRecord, project: ProjectConfig) -> None:
    """Refuse, in one line, a command about a job whose mini cluster has gone (``gone``)."""
    if (line := gone(record, project)) is not None:
        raise HpcboxError(
            line, "its job id may name another job there now; `hpcbox jobs` lists this project's jobs"
        )


@dataclass(frozen=True)
class Unfetched:
    """Jobs of ``project`` whose results are on the cluster and nowhere else."""

    project: Path
    runs: tuple[str, ...]

    def __str__(self) -> str:
        several = "s" if len(self.runs) > 1 else ""
        return f"job{several} {', '.join(self.runs)} of {self.project}"


def unfetched(cluster: Cluster) -> list[Unfetched]:
    """The jobs run on ``cluster`` (this life of it) from the projects that submitted to it, whose
    results are on it and were never fetched: each project's ledger, then one look at the cluster for
    which of those jobs' run folders are there."""
    listed = cluster.secrets.directory / PROJECTS
    candidates: list[tuple[Path, JobRecord]] = []
    for line in listed.read_text().splitlines() if listed.is_file() else []:
        try:
            project = load_project(Path(line))
        except HpcboxError:
            continue  # a project moved or removed since: nothing here to fetch into
        for record in Ledger(project).all():
            if record.incarnation == cluster.incarnation.id and not fetched(project, record):
                candidates.append((project.root, record))
    if not candidates:
        return []
    folders = " ".join(shlex.quote(record.run_dir) for _, record in candidates)
    try:
        with ssh.Connection(cluster.ssh_target()) as connection:
            present = connection.run(
                f'for run in {folders}; do if test -d "$run"; then printf "%s\\n" "$run"; fi; done',
                what="look for the results of jobs never fetched",
            ).stdout.splitlines()
    except HpcboxError:
        # Its login does not answer (its containers stopped): its volumes still hold what they hold.
        present = [record.run_dir for _, record in candidates]
    found: dict[Path, list[str]] = {}
    for root, record in candidates:
        if record.run_dir in present:
            found.setdefault(root, []).append(record.run)
    return [Unfetched(root, tuple(runs)) for root, runs in found.items()]


def refuse_unfetched(
    cluster: Cluster, verb: str = "remove", why: str = "", *, force: bool, say: Callable[[str], None] = print
) -> None:
    """Refuse to ``verb`` ("remove", "replace") ``cluster`` (because ``why``) while it holds results
    never fetched (naming the jobs, by project); with ``force``, say what goes with it and go on."""
    lost = unfetched(cluster)
    if not lost:
        return
    listing = "; ".join(str(jobs) for jobs in lost)
    doing = f"{verb.removesuffix('e')}ing"
    because = f" ({why})" if why else ""
    if not force:
        first = lost[0]
        raise HpcboxError(
            f"cluster {cluster.name} holds the results of {listing}, never fetched: {doing} it{because} "
            "loses them",
            f"fetch them first (`hpcbox fetch -j {first.runs[0]}` in {first.project}), or pass --force",
        )
    say(f"hpcbox: --force: {doing} cluster {cluster.name} loses the results of {listing}, never fetched")


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)
