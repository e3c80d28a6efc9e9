"""Project settings: `[tool.hpcbox]` in the project's pyproject.toml, with defaults."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from hpcbox.errors import FieldError, HpcboxError
from hpcbox.files import project_root
from hpcbox.project import depsource
from hpcbox.project.command import EXAMPLE_TRAINER, ContainerCommand, Steps, command_from_table
from hpcbox.tables import Table, load_toml
from hpcbox.units import parse_time

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


@dataclass(frozen=True)
class CiJob:
    """`[tool.hpcbox.ci]`: the job `hpcbox ci` rehearses on every push, on a mini cluster shaped like
    profile ``cluster`` running Slurm ``slurm`` (None: the nearest to the profile's): the program's
    ``args`` (a small configuration: a CI machine has two cores), within time limit ``time``."""

    args: tuple[str, ...] = ()
    time: str = "15"
    cluster: str = "local"
    slurm: str | None = None


@dataclass(frozen=True)
class ProjectConfig:
    """Where the project is and what of it goes into the image."""

    root: Path
    name: str
    code: tuple[str, ...]
    dockerfile: str = "docker/Dockerfile"
    docker_dir: str = "docker"
    image_repository: str = ""
    data: str = ""  # the dataset a job stages (archive or directory), relative to the root; --data wins
    run: ContainerCommand | Steps = EXAMPLE_TRAINER  # what a job runs in the container
    # The project's own dependency list (requirements.txt, pyproject.toml, environment.yml) that
    # `hpcbox lock` compiles into the pip locks; empty: docker/requirements/*.in, as in this repository.
    dependencies: str = ""
    extras: tuple[str, ...] = ()  # pyproject optional-dependency groups locked with `dependencies`
    ci: CiJob = CiJob()
    # Where the job ledger and fetched results go instead of `.hpcbox/jobs` and `runs/` (None: there).
    # A test session's own mini cluster (hpcbox.testing) counts its jobs from 1 again: its records and
    # results go to the session's folder, not over those of the user's own `local` cluster.
    ledger_dir: Path | None = None
    results_dir: Path | None = None

    @property
    def repository(self) -> str:
        return self.image_repository or f"hpcbox/{self.name}"

    @property
    def state_dir(self) -> Path:
        """Git-ignored local state: caches, the job ledger (the mini cluster's keys are the user's:
        minicluster/state.py)."""
        return self.root / ".hpcbox"

    @property
    def jobs_dir(self) -> Path:
        """The job ledger's folder: one JSON file per submitted job."""
        return self.ledger_dir or self.state_dir / "jobs"

    @property
    def runs_dir(self) -> Path:
        """Where `fetch` brings each job's results: `<runs>/<cluster>/<job id>/`."""
        return self.results_dir or self.root / "runs"


def find_root(start: Path | None = None) -> Path:
    root = project_root(start)
    if root is not None:
        return root
    raise HpcboxError(
        f"no pyproject.toml in {(start or Path.cwd()).resolve()} or any parent",
        "run hpcbox from inside your project, or create a pyproject.toml with a [tool.hpcbox] table",
    )


def load_project(root: Path | None = None) -> ProjectConfig:
    """Read `[tool.hpcbox]`; HPCBOX_IMAGE_REPOSITORY overrides where images are tagged. A key it does not
    know is a typo, said at once rather than ignored."""
    root = find_root(root)
    data = load_toml(root / "pyproject.toml")
    table = Table(data, "").table("tool", required=False).table("hpcbox", required=False)
    name = table.get("project", str) or data.get("project", {}).get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise HpcboxError(
            f"tool.hpcbox.project: {name!r} is not a valid image name",
            "use lower-case letters, digits, '.', '_' or '-', e.g. project = \"trainer\"",
        )
    code = table.str_list("code", default=[], hint='e.g. code = ["src/mypackage"]')
    for item in code:
        if not (root / item).exists():
            raise HpcboxError(
                f"tool.hpcbox.code: {item} does not exist in {root}", "list your package's folder"
            )
    run = table.get("run", dict, hint='e.g. [tool.hpcbox.run] module = "mypackage.train"')
    command: ContainerCommand | Steps = EXAMPLE_TRAINER
    if run is not None:
        command = command_from_table(
            run,
            code,
            lambda relative: (root / relative).is_file(),
            data.get("project", {}).get("scripts", {}),
        )
    dependencies, extras = _dependencies(table, root)
    ci = _ci_job(table.table("ci", required=False))
    # Read whatever the environment says: the setting is checked, and known, either way.
    image_repository = table.get("image_repository", str, default="")
    config = ProjectConfig(
        root=root,
        name=name,
        code=tuple(code),
        dockerfile=table.string("dockerfile", default="docker/Dockerfile"),
        docker_dir=table.string("docker_dir", default="docker"),
        image_repository=os.environ.get("HPCBOX_IMAGE_REPOSITORY") or image_repository,
        data=table.get("data", str, default=""),
        run=command,
        dependencies=dependencies,
        extras=extras,
        ci=ci,
    )
    # [tool.hpcbox.resources] is the job's: the resource options read it, per cluster.
    table.reject_extra({"resources"}, what="[tool.hpcbox] setting")
    return config


def _ci_job(table: Table) -> CiJob:
    """`[tool.hpcbox.ci]`, each key checked here (the profile and the Slurm version where the
    rehearsal starts, as the cluster options are)."""
    time = table.get("time", str, default=CiJob.time, hint='minutes or H:M:S, e.g. time = "10"')
    parse_time(time, table.key("time"))
    ci = CiJob(
        args=tuple(table.str_list("args", default=[], hint='e.g. args = ["--epochs", "1"]')),
        time=time,
        cluster=table.name("cluster", default=CiJob.cluster, hint='a cluster profile, e.g. cluster = "edi"'),
        slurm=table.optional_string("slurm"),
    )
    table.reject_extra(what="[tool.hpcbox.ci] setting")
    return ci


def _dependencies(table: Table, root: Path) -> tuple[str, tuple[str, ...]]:
    """`dependencies` and `extras`, checked now so that a wrong path fails every command, not only lock."""
    dependencies = table.get("dependencies", str, default="", hint='e.g. dependencies = "requirements.txt"')
    extras = table.str_list("extras", default=[], hint='e.g. extras = ["train"]')
    if extras and not dependencies:
        raise FieldError(depsource.EXTRAS_SETTING, f"needs {depsource.SETTING} to name a pyproject.toml")
    if dependencies:
        depsource.from_setting(root, dependencies, tuple(extras))
    return dependencies, tuple(extras)
