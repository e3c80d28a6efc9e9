"""hpcbox as a library: a Slurm site resolved once (`Site`), the jobs sent there (`Job`), and this project's
environment (`Project`: its image, SIF and locks).

    import hpcbox

    site = hpcbox.Site("edi")  # its profile, its login node, this project: resolved once
    job = site.submit(["--epochs", "3"], gpus=1, time="2:00:00")
    print(job.wait())  # COMPLETED, on node ...
    job.fetch()  # runs/edi/<job id>/

Each `hpcbox` command about jobs is a call of this API; nothing here knows about invoke. Importing it
loads neither the Docker SDK nor invoke: a submit loads what it builds with when it builds.
"""

from hpcbox.api.job import Job, describe
from hpcbox.api.project import Project
from hpcbox.api.race import Entrant, Raced, entrants, listed, race
from hpcbox.api.site import (
    Checkup,
    Pruning,
    Site,
    draft_profile,
    overview,
    remove_mini_cluster,
    up_mini_cluster,
)
from hpcbox.tools.ssh import Target  # a login node reached exactly so: `Site(name, login=Target(...))`

__all__ = [
    "CONVENTIONS", "Checkup", "Entrant", "Job", "Project", "Pruning", "Raced", "Site", "Target", "describe",
    "draft_profile", "entrants", "listed", "overview", "race", "remove_mini_cluster", "up_mini_cluster",
]  # fmt: skip


def __getattr__(name: str) -> object:
    # The site conventions come with the profile drafter and the doctor, which no other command loads.
    if name == "CONVENTIONS":
        from hpcbox.survey.draft import CONVENTIONS

        return CONVENTIONS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
