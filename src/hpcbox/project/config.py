"""Project settings: `[tool.hpcbox]` in the project's pyproject.toml, with defaults."""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from hpcbox.errors import FieldError, HpcboxError
from hpcbox.files import project_root
from hpcbox.project import depsource
from hpcbox.project.command import EXAMPLE_TRAINER, ContainerCommand, Steps, command_from_table

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


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

    @property
    def repository(self) -> str:
        return self.image_repository or f"hpcbox/{self.name}"

    @property
    def state_dir(self) -> Path:
        """Git-ignored local state: caches, the job ledger, the mini cluster's generated secrets."""
        return self.root / ".hpcbox"


def find_root(start: Path | None = None) -> Path:
    root = project_root(start)
    if root is not None:
        return root
    raise HpcboxError(
        f"no pyproject.toml in {(start or Path.cwd()).resolve()} or any parent",
        "run hpcbox from inside your project, or create a pyproject.toml with a [tool.hpcbox] table",
    )


def load_project(root: Path | None = None) -> ProjectConfig:
    """Read `[tool.hpcbox]`; HPCBOX_IMAGE_REPOSITORY overrides where images are tagged."""
    root = find_root(root)
    pyproject = root / "pyproject.toml"
    try:
        data = tomllib.loads(pyproject.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise HpcboxError(f"{pyproject} is not valid TOML: {exc}", "fix the syntax error it names") from exc
    table = data.get("tool", {}).get("hpcbox", {})
    name = table.get("project") or data.get("project", {}).get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise HpcboxError(
            f"tool.hpcbox.project: {name!r} is not a valid image name",
            "use lower-case letters, digits, '.', '_' or '-', e.g. project = \"trainer\"",
        )
    code = table.get("code", [])
    if not isinstance(code, list) or not all(isinstance(item, str) for item in code):
        raise HpcboxError("tool.hpcbox.code: must be a list of paths", 'e.g. code = ["src/mypackage"]')
    for item in code:
        if not (root / item).exists():
            raise HpcboxError(
                f"tool.hpcbox.code: {item} does not exist in {root}", "list your package's folder"
            )
    run = table.get("run")
    if run is not None and not isinstance(run, dict):
        raise HpcboxError(
            "tool.hpcbox.run: must be a table", 'e.g. [tool.hpcbox.run] module = "mypackage.train"'
        )
    command: ContainerCommand | Steps = EXAMPLE_TRAINER
    if run is not None:
        command = command_from_table(
            run,
            code,
            lambda relative: (root / relative).is_file(),
            data.get("project", {}).get("scripts", {}),
        )
    dependencies, extras = _dependencies(table, root)
    return ProjectConfig(
        root=root,
        name=name,
        code=tuple(code),
        dockerfile=table.get("dockerfile", "docker/Dockerfile"),
        docker_dir=table.get("docker_dir", "docker"),
        image_repository=os.environ.get("HPCBOX_IMAGE_REPOSITORY") or table.get("image_repository", ""),
        data=str(table.get("data", "")),
        run=command,
        dependencies=dependencies,
        extras=extras,
    )


def _dependencies(table: dict, root: Path) -> tuple[str, tuple[str, ...]]:
    """`dependencies` and `extras`, checked now so that a wrong path fails every command, not only lock."""
    dependencies = table.get("dependencies", "")
    extras = table.get("extras", [])
    if not isinstance(dependencies, str):
        raise FieldError(depsource.SETTING, "must be a path", 'e.g. dependencies = "requirements.txt"')
    if not isinstance(extras, list) or not all(isinstance(extra, str) for extra in extras):
        raise FieldError(depsource.EXTRAS_SETTING, "must be a list of names", 'e.g. extras = ["train"]')
    if extras and not dependencies:
        raise FieldError(depsource.EXTRAS_SETTING, f"needs {depsource.SETTING} to name a pyproject.toml")
    if dependencies:
        depsource.from_setting(root, dependencies, tuple(extras))
    return dependencies, tuple(extras)
