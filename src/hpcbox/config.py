"""Project settings: `[tool.hpcbox]` in the project's pyproject.toml, with defaults."""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from hpcbox.command import EXAMPLE_TRAINER, ContainerCommand, Steps, command_from_table
from hpcbox.errors import HpcboxError

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

    @property
    def repository(self) -> str:
        return self.image_repository or f"hpcbox/{self.name}"

    @property
    def state_dir(self) -> Path:
        """Git-ignored local state: caches, the job ledger, the mini cluster's generated secrets."""
        return self.root / ".hpcbox"


def find_root(start: Path | None = None) -> Path:
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "pyproject.toml").is_file():
            return candidate
    raise HpcboxError(
        f"no pyproject.toml in {here} or any parent",
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
    return ProjectConfig(
        root=root,
        name=name,
        code=tuple(code),
        dockerfile=table.get("dockerfile", "docker/Dockerfile"),
        docker_dir=table.get("docker_dir", "docker"),
        image_repository=os.environ.get("HPCBOX_IMAGE_REPOSITORY") or table.get("image_repository", ""),
        data=str(table.get("data", "")),
        run=command,
    )
