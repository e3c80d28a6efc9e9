"""`hpcbox init` on projects laid out the ways researchers lay them out, through the real command."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hpcbox.project.config import load_project
from hpcbox.project.init import DOCKER_FILES, docker_template

TRAIN = "import argparse\nimport helpers\n"


def hpcbox(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`hpcbox ARGS` from this environment (`python -m hpcbox` is the console script's own entry)."""
    return subprocess.run(
        [sys.executable, "-m", "hpcbox", *args],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "HPCBOX_IMAGE_REPOSITORY": ""},
    )


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def flat_project(tmp_path: Path) -> Path:
    """A script-and-modules project with a requirements.txt and no pyproject.toml."""
    root = tmp_path / "My Project"
    root.mkdir()
    (root / "train.py").write_text(TRAIN)
    (root / "helpers.py").write_text("SCALE = 2\n")
    (root / "requirements.txt").write_text("numpy\ntabulate==0.9.0\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_helpers.py").write_text("")
    return root


def test_init_adds_what_hpcbox_needs_and_says_what_it_added(flat_project: Path):
    done = hpcbox(flat_project, "init", "--args=--data {data_dir} --out {output_dir}")
    assert done.returncode == 0, done.stderr
    added = [line.removeprefix("hpcbox init: ") for line in done.stdout.splitlines()]
    assert added[:-1] == [
        "added docker/Dockerfile",
        "added docker/apt-install.sh",
        "added docker/lock/base.toml",
        "added docker/lock/apt-system.txt",
        "added docker/lock/apt-cpu.txt",
        "added docker/lock/apt-venv.txt",
        "added docker/lock/apt-notebook.txt",
        "added pyproject.toml",
        "added tasks.py",
        "added .gitignore",
    ]
    assert "hpcbox lock --pip-only" in added[-1]
    assert (flat_project / "docker/Dockerfile").read_text() == (docker_template() / "Dockerfile").read_text()
    # hpcbox's own files, executable or not as they are: the build context carries the bit into the
    # image, so the project's apt layers are the example trainer's (measured: a bit more on
    # apt-install.sh cost the suite's own project a second install of Debian's PyTorch).
    for relative in DOCKER_FILES:
        mine, own = flat_project / "docker" / relative, docker_template() / relative
        assert mine.read_bytes() == own.read_bytes(), relative
        assert os.access(mine, os.X_OK) == os.access(own, os.X_OK), relative
    table = tomllib.loads((flat_project / "pyproject.toml").read_text())["tool"]["hpcbox"]
    assert table["project"] == "my-project"
    assert table["code"] == ["helpers.py", "train.py"]  # the modules the script imports travel with it
    assert table["dependencies"] == "requirements.txt"
    assert table["run"] == {"script": "train.py", "args": ["--data", "{data_dir}", "--out", "{output_dir}"]}
    # what hpcbox makes of it: the job runs the script from the code snapshot
    project = load_project(flat_project)
    assert (project.run.kind, project.run.target) == ("script", "/code/train.py")
    assert project.run.resolved_args() == ("--data", "/scratch/data", "--out", "/scratch/out")
    assert (
        flat_project / "tasks.py"
    ).read_text() == "from hpcbox.tasks import collection\n\nns = collection()\n"
    assert (flat_project / ".gitignore").read_text() == ".hpcbox/\nruns/\n"
    listed = subprocess.run(
        [sys.executable, "-m", "invoke", "--list"], cwd=flat_project, capture_output=True, text=True
    )
    assert listed.returncode == 0 and "submit" in listed.stdout and "cluster.up" in listed.stdout


def test_init_twice_changes_nothing(flat_project: Path):
    assert hpcbox(flat_project, "init").returncode == 0
    before = snapshot(flat_project)
    again = hpcbox(flat_project, "init")
    assert again.returncode == 0, again.stderr
    assert again.stdout == "hpcbox init: nothing to add: hpcbox is set up here\n"
    assert snapshot(flat_project) == before


def test_init_keeps_the_users_files_and_adds_to_them(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "Seg_Net"\ndependencies = ["torch>=2.1", "pyyaml"]\n\n'
        '[project.scripts]\nsegtrain = "segnet.cli:main"\n\n[tool.ruff]\nline-length = 99'
    )
    (tmp_path / "src/segnet").mkdir(parents=True)
    (tmp_path / "src/segnet/__init__.py").write_text("")
    (tmp_path / "src/segnet/cli.py").write_text("def main():\n    return 0\n")
    (tmp_path / ".gitignore").write_text("*.ckpt")
    tasks = "from invoke import task\n\n@task\ndef plot(c):\n    pass\n"
    (tmp_path / "tasks.py").write_text(tasks)
    done = hpcbox(tmp_path, "init")
    assert done.returncode == 0, done.stderr
    assert "appended to pyproject.toml" in done.stdout and "appended to .gitignore" in done.stdout
    assert "tasks.py is yours" in done.stdout
    assert (tmp_path / "tasks.py").read_text() == tasks
    assert (
        tmp_path / ".gitignore"
    ).read_text() == "*.ckpt\n# hpcbox's local state and fetched runs\n.hpcbox/\nruns/\n"
    text = (tmp_path / "pyproject.toml").read_text()
    assert text.startswith('[project]\nname = "Seg_Net"') and "line-length = 99\n\n[tool.hpcbox]\n" in text
    data = tomllib.loads(text)
    assert data["tool"]["ruff"] == {"line-length": 99}
    assert data["tool"]["hpcbox"]["project"] == "seg_net"
    assert data["tool"]["hpcbox"]["code"] == ["src/segnet"]
    assert data["tool"]["hpcbox"]["dependencies"] == "pyproject.toml"
    assert data["tool"]["hpcbox"]["run"] == {"entry_point": "segtrain", "args": []}
    run = load_project(tmp_path).run
    assert (run.kind, run.target) == ("entry_point", "segnet.cli:main")
    assert run.program_words() == (
        "python",
        "-c",
        "import sys; from segnet.cli import main; sys.argv[0] = 'segnet.cli'; sys.exit(main())",
    )


def test_a_dockerfile_of_the_projects_own_is_refused_and_nothing_is_written(flat_project: Path):
    (flat_project / "docker").mkdir()
    (flat_project / "docker/Dockerfile").write_text("FROM python:3.12\n")
    before = snapshot(flat_project)
    refused = hpcbox(flat_project, "init")
    assert refused.returncode == 1
    assert refused.stderr.splitlines()[0] == (
        "error: docker/Dockerfile exists and is not hpcbox's: init does not overwrite it"
    )
    assert "--dockerfile docker/hpcbox.Dockerfile" in refused.stderr
    assert snapshot(flat_project) == before
    # the way out it names: hpcbox's stages beside the project's own
    beside = hpcbox(flat_project, "init", "--dockerfile=docker/hpcbox.Dockerfile")
    assert beside.returncode == 0, beside.stderr
    assert (flat_project / "docker/Dockerfile").read_text() == "FROM python:3.12\n"
    project = load_project(flat_project)
    assert (project.dockerfile, project.docker_dir) == ("docker/hpcbox.Dockerfile", "docker")


@pytest.mark.parametrize(
    ("layout", "flags", "says"),
    [
        ({"train.py": "", "train_big.py": ""}, [], "found several: train.py, train_big.py"),
        ({"model.py": ""}, [], "which program does a job run? found none"),
        ({"train.py": ""}, ["--script=train.py", "--module=x"], "give one of --module, --script and"),
        ({"train.py": "", "requirements.txt": "numpy\n"}, ["--code=missing"], "--code: missing does not"),
        ({"train.py": ""}, [], "no dependencies found"),
        ({"train.py": "", "requirements.txt": "x\n"}, ["--dependencies=reqs.txt"], "reqs.txt does not"),
        ({"train.py": "", "pyproject.toml": "[project\n"}, [], "pyproject.toml is not valid TOML"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, layout: dict[str, str], flags, says: str):
    for name, text in layout.items():
        (tmp_path / name).write_text(text)
    before = snapshot(tmp_path)
    refused = hpcbox(tmp_path, "init", *flags)
    assert refused.returncode == 1
    first = refused.stderr.splitlines()[0]
    assert first.startswith("error: ") and says in first, refused.stderr
    assert "Traceback" not in refused.stderr
    assert snapshot(tmp_path) == before


def test_a_package_with_a_main_module_is_run_with_python_m(tmp_path: Path):
    (tmp_path / "fancy").mkdir()
    (tmp_path / "fancy/__init__.py").write_text("")
    (tmp_path / "fancy/__main__.py").write_text("")
    (tmp_path / "environment.yml").write_text("dependencies:\n  - numpy=1.26\n")
    done = hpcbox(tmp_path, "init")
    assert done.returncode == 0, done.stderr
    table = tomllib.loads((tmp_path / "pyproject.toml").read_text())["tool"]["hpcbox"]
    assert (table["code"], table["run"], table["dependencies"]) == (
        ["fancy"],
        {"module": "fancy", "args": []},
        "environment.yml",
    )


def test_init_ci_adds_a_workflow_the_script_it_runs_and_the_ci_table_and_never_overwrites(flat_project: Path):
    assert hpcbox(flat_project, "init", "--args=--out {output_dir}").returncode == 0
    done = hpcbox(flat_project, "init", "--ci")
    assert done.returncode == 0, done.stderr
    said = [line.removeprefix("hpcbox init: ") for line in done.stdout.splitlines()]
    assert said[:3] == [
        "added .github/workflows/hpcbox.yml",
        "added ci/hpcbox-ci.sh",
        "appended to pyproject.toml",
    ]
    script = flat_project / "ci" / "hpcbox-ci.sh"
    assert os.access(script, os.X_OK)
    assert "ci/hpcbox-ci.sh" in (flat_project / ".github" / "workflows" / "hpcbox.yml").read_text()
    # The script is valid bash, and the workflow runs it rather than holding steps of its own.
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    assert load_project(flat_project).ci.cluster == "local"
    assert load_project(flat_project).ci.time == "15"
    # A second init --ci adds nothing, and a workflow the user changed stays as it is.
    workflow = flat_project / ".github" / "workflows" / "hpcbox.yml"
    workflow.write_text("# mine\n")
    before = snapshot(flat_project)
    again = hpcbox(flat_project, "init", "--ci")
    assert again.returncode == 0 and "nothing to add" in again.stdout, again.stdout
    assert snapshot(flat_project) == before


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ('time = "soon"', "error: tool.hpcbox.ci.time: 'soon' is not a Slurm time"),
        ("args = [1]", "error: tool.hpcbox.ci.args: [1] must be a list of non-empty strings"),
        ('cluster = "no such/profile"', "error: tool.hpcbox.ci.cluster: 'no such/profile': use letters"),
        ('clustr = "edi"', "error: tool.hpcbox.ci.clustr: is not a [tool.hpcbox.ci] setting (a typo? "
         "allowed: args, cluster, slurm, time)"),
    ],
)  # fmt: skip
def test_a_bad_ci_table_is_one_line_naming_its_field(flat_project: Path, table: str, says: str):
    assert hpcbox(flat_project, "init").returncode == 0
    with (flat_project / "pyproject.toml").open("a") as pyproject:
        pyproject.write(f"\n[tool.hpcbox.ci]\n{table}\n")
    before = snapshot(flat_project)
    done = hpcbox(flat_project, "ci")
    assert done.returncode == 1
    assert done.stderr.splitlines()[0].startswith(says), done.stderr
    assert snapshot(flat_project) == before
