"""`hpcbox init`: adopt hpcbox in an existing project without touching what is there.

It adds hpcbox's Dockerfile and system locks (docker/), a `[tool.hpcbox]` table saying what to ship
and run, a tasks.py for `invoke`, and .gitignore lines for hpcbox's local state. A file that exists is
kept as it is (a second `init` adds nothing); the one conflict it refuses is a Dockerfile of the
project's own where hpcbox's would go, before writing anything.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from hpcbox.errors import HpcboxError
from hpcbox.files import write_atomically
from hpcbox.project import ci_files
from hpcbox.project.depsource import detect
from hpcbox.project.notebook_script import convert
from hpcbox.tables import load_toml, toml_value

# What init copies from hpcbox's own docker/: the stages and the system locks, pinned together with
# the Debian base. The pip locks are the project's own: `hpcbox lock --pip-only` writes them.
DOCKER_FILES = (
    "apt-install.sh",
    "lock/base.toml",
    "lock/apt-system.txt",
    "lock/apt-cpu.txt",
    "lock/apt-venv.txt",
    "lock/apt-notebook.txt",
)
TASKS_LINES = "from hpcbox.tasks import collection\n\nns = collection()\n"
IGNORED = (".hpcbox/", "runs/")
# Top-level Python files that are tooling, not the program's code.
# hpcbox's own docker/: package data in an installed hpcbox (pyproject.toml's package-dir), this
# repository's folder in a checkout or an editable install of one.
_PACKAGED_DOCKER = Path(__file__).resolve().parents[1] / "shipped" / "docker"
_CHECKOUT_DOCKER = Path(__file__).resolve().parents[3] / "docker"
_NOT_CODE = {"setup.py", "tasks.py", "conftest.py", "noxfile.py", "fabfile.py"}
_NOT_PACKAGES = {"tests", "test", "docs", "docker", "slurm", "build", "dist"}


@dataclass(frozen=True)
class Program:
    """What a job runs: one `[tool.hpcbox.run]` key (module, script or entry_point) and its args."""

    kind: str
    target: str
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Addition:
    path: str  # relative to the project root
    text: str
    append: bool = False  # added at the end of an existing file
    executable: bool = False


@dataclass(frozen=True)
class InitPlan:
    additions: tuple[Addition, ...]
    notes: tuple[str, ...]  # what the user does next, or has to do by hand


def docker_template() -> Path:
    """The folder of hpcbox's own image inputs (Dockerfile, apt-install.sh, locks) that init copies."""
    return _PACKAGED_DOCKER if _PACKAGED_DOCKER.is_dir() else _CHECKOUT_DOCKER


def plan_init(
    root: Path,
    *,
    program: Program | None = None,
    args: Sequence[str] = (),
    code: Sequence[str] = (),
    dependencies: str | None = None,
    dockerfile: str = "docker/Dockerfile",
    name: str | None = None,
    from_notebook: str | None = None,
    ci: bool = False,
) -> InitPlan:
    """What `init` would add to the project at ``root``; refuses (HpcboxError) before anything is written.

    ``from_notebook``: a notebook in the project, whose script (beside it) becomes the program; ``ci``:
    a GitHub Actions workflow and the script it runs (`hpcbox ci`), and `[tool.hpcbox.ci]`."""
    pyproject = root / "pyproject.toml"
    data = load_toml(pyproject) if pyproject.is_file() else {}
    configured = "hpcbox" in data.get("tool", {})
    additions: list[Addition] = []
    notes: list[str] = []
    if from_notebook is not None:
        script, kept_notes = _notebook_program(root, from_notebook, program, configured)
        program = Program("script", script.path)
        additions.append(script)
        notes += kept_notes

    if configured:
        dockerfile = data["tool"]["hpcbox"].get("dockerfile", "docker/Dockerfile")
    template = docker_template()
    target = root / dockerfile
    if target.is_file() and target.read_text() != (template / "Dockerfile").read_text() and not configured:
        raise HpcboxError(
            f"{dockerfile} exists and is not hpcbox's: init does not overwrite it",
            "hpcbox builds its own stages; add them beside yours with `hpcbox init --dockerfile "
            "docker/hpcbox.Dockerfile`, or move yours aside and run init again",
        )
    docker_dir = Path(dockerfile).parent.as_posix()
    wanted = {dockerfile: template / "Dockerfile"}
    wanted.update({f"{docker_dir}/{relative}": template / relative for relative in DOCKER_FILES})
    # Executable or not as hpcbox's own: the build context carries the bit into the image, so a project's
    # apt layers are the example trainer's (Debian's PyTorch installed once on a machine, not per project).
    additions += [
        Addition(path, source.read_text(), executable=os.access(source, os.X_OK))
        for path, source in wanted.items()
        if not (root / path).exists()
    ]

    if not configured:
        table = hpcbox_table(
            root,
            data,
            program=replace(program or detect_program(root, data), args=tuple(args)),
            code=code,
            dependencies=dependencies,
            dockerfile=dockerfile,
            name=name,
            planned=[addition.path for addition in additions],
        )
        additions.append(Addition("pyproject.toml", table, append=pyproject.is_file()))
        notes.append("next: `hpcbox lock --pip-only` (your dependencies, hashed), then `hpcbox build`")
    if ci:
        additions += _ci_additions(root, data, appended_table=not configured)
        notes.append(
            f"CI: `{ci_files.SCRIPT}` runs what {ci_files.WORKFLOW} runs on every push; "
            "[tool.hpcbox.ci] says what the job is given"
        )

    tasks = root / "tasks.py"
    if not tasks.exists():
        additions.append(Addition("tasks.py", TASKS_LINES))
    elif "hpcbox.tasks" not in tasks.read_text():
        # Appended lines would replace the file's own tasks: invoke uses `ns` alone when it is there.
        notes.append(
            "tasks.py is yours: to run hpcbox through `invoke`, add hpcbox's collection to your namespace "
            "(`from hpcbox.tasks import collection`); the `hpcbox` command needs nothing"
        )

    gitignore = root / ".gitignore"
    present = gitignore.read_text().splitlines() if gitignore.is_file() else []
    missing = [line for line in IGNORED if line not in present and line.rstrip("/") not in present]
    if missing:
        text = "".join(f"{line}\n" for line in missing)
        if gitignore.is_file() and present:
            prefix = "" if gitignore.read_text().endswith("\n") else "\n"
            text = f"{prefix}# hpcbox's local state and fetched runs\n{text}"
        additions.append(Addition(".gitignore", text, append=gitignore.is_file()))
    return InitPlan(tuple(additions), tuple(notes))


def _ci_additions(root: Path, pyproject: dict, *, appended_table: bool) -> list[Addition]:
    """The CI files the project lacks, and `[tool.hpcbox.ci]` where its pyproject.toml has none
    (``appended_table``: init appends `[tool.hpcbox]` to it first)."""
    additions = [
        Addition(path, text, executable=path == ci_files.SCRIPT)
        for path, text in {ci_files.WORKFLOW: ci_files.workflow(), ci_files.SCRIPT: ci_files.script()}.items()
        if not (root / path).exists()
    ]
    if "ci" not in pyproject.get("tool", {}).get("hpcbox", {}):
        existing = "" if appended_table else (root / "pyproject.toml").read_text()
        prefix = "\n" if appended_table or existing.endswith("\n") else "\n\n"
        additions.append(Addition("pyproject.toml", ci_files.ci_table([], prefix), append=True))
    return additions


def apply(root: Path, plan: InitPlan) -> list[str]:
    """Write the plan's additions; one line per file saying what was added."""
    lines = []
    for addition in plan.additions:
        path = root / addition.path
        if addition.append:
            with path.open("a") as handle:
                handle.write(addition.text)
            lines.append(f"appended to {addition.path}")
        else:
            write_atomically(path, addition.text, mode=0o755 if addition.executable else None)
            lines.append(f"added {addition.path}")
    return lines


def hpcbox_table(
    root: Path,
    pyproject: dict,
    *,
    program: Program,
    code: Sequence[str],
    dependencies: str | None,
    dockerfile: str,
    name: str | None,
    planned: Sequence[str] = (),
) -> str:
    """The `[tool.hpcbox]` table for this project, as TOML text to add to pyproject.toml; ``planned``:
    the files this init adds (a notebook's script)."""
    project = name or project_name(root, pyproject)
    paths = list(code) or detect_code(root, program)
    for path in paths:
        if not (root / path).exists() and path not in planned:
            raise HpcboxError(
                f"--code: {path} does not exist in {root}", "name a folder or file of your code"
            )
    if dependencies is None:
        source = detect(root)
        if source is None:
            raise HpcboxError(
                f"no dependencies found in {root}: no requirements.txt, pyproject.toml dependencies or "
                "environment.yml",
                "list what your code imports in requirements.txt, or pass --dependencies FILE",
            )
        dependencies = Path(source.path).resolve().relative_to(root.resolve()).as_posix()
    elif not (root / dependencies).is_file():
        raise HpcboxError(
            f"--dependencies: {dependencies} does not exist in {root}", "name your requirements file"
        )
    lines = [
        "[tool.hpcbox]",
        "# Written by `hpcbox init`: what hpcbox builds, ships and runs (see hpcbox's docs/own-project.md).",
        f"project = {toml_value(project)}",
        f"code = {toml_value(paths)}",
        f"dependencies = {toml_value(dependencies)}",
    ]
    if dockerfile != "docker/Dockerfile":
        lines += [
            f"dockerfile = {toml_value(dockerfile)}",
            f"docker_dir = {toml_value(Path(dockerfile).parent.as_posix())}",
        ]
    lines += [
        "",
        "[tool.hpcbox.run]",
        "# {data_dir}: the dataset on the node's scratch; {output_dir}: copied back by `hpcbox fetch`.",
        f"{program.kind} = {toml_value(program.target)}",
        f"args = {toml_value(list(program.args))}",
    ]
    existing = (root / "pyproject.toml").read_text() if (root / "pyproject.toml").is_file() else ""
    # A blank line between the file's last table and this one.
    prefix = "" if not existing else "\n" if existing.endswith("\n") else "\n\n"
    return prefix + "\n".join(lines) + "\n"


def detect_program(root: Path, pyproject: dict) -> Program:
    """The one program the project obviously runs: its only console script, its only train/main
    script, or its only package with a __main__.py; refuses when there is none or several."""
    scripts = pyproject.get("project", {}).get("scripts", {})
    if len(scripts) == 1:
        return Program("entry_point", next(iter(scripts)))
    candidates = sorted(
        path.relative_to(root).as_posix()
        for pattern in ("train*.py", "main.py", "scripts/train*.py")
        for path in root.glob(pattern)
        if path.is_file()
    )
    if len(candidates) == 1:
        return Program("script", candidates[0])
    mains = sorted(
        ".".join(path.parent.relative_to(base).parts)
        for base in (root, root / "src")
        for path in base.glob("*/__main__.py")
        if (path.parent / "__init__.py").is_file()
    )
    if not candidates and len(mains) == 1:
        return Program("module", mains[0])
    found = [*scripts, *candidates, *mains]
    raise HpcboxError(
        "which program does a job run? " + (f"found several: {', '.join(found)}" if found else "found none"),
        "pass --script train.py, --module mypackage.train or --entry-point NAME (a [project.scripts] name)",
    )


def detect_code(root: Path, program: Program) -> list[str]:
    """The paths a job needs: top-level modules and packages (also under src/), and the script's folder."""
    found = {path.name for path in root.glob("*.py") if path.name not in _NOT_CODE}
    for base, prefix in ((root, ""), (root / "src", "src/")):
        found |= {
            f"{prefix}{path.parent.name}"
            for path in base.glob("*/__init__.py")
            if path.parent.name not in _NOT_PACKAGES
        }
    if program.kind == "script":
        first = Path(program.target).parts[0]
        found.add(first)
    if not found:
        raise HpcboxError(
            f"no Python code found in {root}", "pass --code PATH for each folder or file of your code"
        )
    return sorted(found)


def project_name(root: Path, pyproject: dict) -> str:
    """[project] name, else the folder's, as an image name (lower case, . _ - kept)."""
    given = str(pyproject.get("project", {}).get("name") or root.resolve().name)
    name = re.sub(r"[^a-z0-9._-]+", "-", given.lower()).strip("-._")
    if not name:
        raise HpcboxError(f"cannot make an image name of {given!r}", "pass --name NAME")
    return name


def program_from_flags(module: str | None, script: str | None, entry_point: str | None) -> Program | None:
    """The program the user named, if one (its args come separately)."""
    given = [
        (kind, value)
        for kind, value in (("module", module), ("script", script), ("entry_point", entry_point))
        if value
    ]
    if len(given) > 1:
        raise HpcboxError("give one of --module, --script and --entry-point", "a job runs one program")
    return Program(*given[0]) if given else None


def _notebook_program(
    root: Path, notebook: str, program: Program | None, configured: bool
) -> tuple[Addition, list[str]]:
    """The script of ``notebook`` (beside it) as an addition, and what to tell the user about it."""
    if program is not None:
        raise HpcboxError("--from-notebook names the program: leave out --module, --script and --entry-point")
    path = (root / notebook).resolve()
    if not path.is_relative_to(root.resolve()):
        raise HpcboxError(
            f"--from-notebook: {notebook} is outside the project", "copy it into the project first"
        )
    converted = convert(path, notebook)
    if configured:
        raise HpcboxError(
            "hpcbox is set up here already: init does not change [tool.hpcbox.run]",
            "convert the notebook with `jupyter nbconvert --to script` and set script = in [tool.hpcbox.run]",
        )
    script = path.with_suffix(".py").relative_to(root.resolve()).as_posix()
    if (root / script).exists():
        raise HpcboxError(f"--from-notebook: {script} exists: init does not overwrite it", "move it aside")
    notes = [f"{script} is {notebook}'s program ({converted.code_cells} code cells)"]
    notes += [f"{script}: cell {kept.cell} kept out as comments: {kept.why}" for kept in converted.kept_out]
    notes.append(
        f"{script} runs with node scratch as its working folder: read the dataset from the folder "
        "--args gives as {data_dir}, write what to keep under {output_dir}"
    )
    return Addition(script, converted.text), notes
