"""The resource options' one table (hpcbox.render.options) against everything that reads it: the request,
the commands' flags, [tool.hpcbox.resources], the #SBATCH header, `hpcbox shell`'s srun line and the
bsub header, each rendered for real."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest

from hpcbox.cli.tasks import SHORT_FLAGS, collection
from hpcbox.render import profiles
from hpcbox.render.bsub import renderer
from hpcbox.render.options import RESOURCE_OPTIONS
from hpcbox.render.resources import FieldError, ResourceRequest, project_defaults, resolve
from hpcbox.render.sbatch import JobInputs, render_shell

ANNOTATIONS = {str: "str | None", int: "int | None", bool: "bool | None", tuple: "tuple[str, ...]"}
# A value of each option that the local profile (Slurm) takes, and one the dtu profile (LSF) takes.
SLURM_JOB = ResourceRequest(
    job_name="all", partition="gpu", nodes=1, ntasks_per_node=1, cpus=2, mem="2G", time="10",
    account="hpcbox", qos="normal", array="0-1", mail_user="me@example.org", mail_type="END",
    log="logs/%x-%A_%a.out", error_log="logs/%x-%A_%a.err", gpus=1,
)  # fmt: skip
LSF_JOB = ResourceRequest(
    job_name="all", partition="gpua100", cpus=4, mem="8G", time="1:00:00", account="p1",
    mail_user="me@example.org", mail_type="BEGIN,END", log="logs/%x-%j.out", error_log="logs/%x-%j.err",
    gpus=1,
)  # fmt: skip
VALUES = {str: "x", int: 2, bool: True, tuple: ["--exclusive"]}


def test_the_request_has_a_field_per_option_of_its_kind():
    fields = {field.name: field.type for field in dataclasses.fields(ResourceRequest)}
    assert fields == {option.name: ANNOTATIONS[option.kind] for option in RESOURCE_OPTIONS}


@pytest.mark.parametrize("command", ["sbatch", "submit", "shell"])
def test_every_option_is_a_flag_of_each_job_command_with_its_help_and_letter(command: str):
    task = collection()[command]
    arguments = {argument.attr_name or argument.name: argument for argument in task.get_arguments()}
    for option in RESOURCE_OPTIONS:
        if command == "shell" and not option.in_shell:
            assert option.name not in arguments
            continue
        argument = arguments[option.name]
        assert argument.help == option.help
        assert set(argument.names) == {option.flag, *([option.short] if option.short else [])}
        assert argument.kind is (
            list if option.kind is tuple else option.kind if option.kind is bool else str
        )
    assert {name: letter for name, (letter, _) in SHORT_FLAGS.items() if name in arguments} == {
        option.name: option.short for option in RESOURCE_OPTIONS if option.short and option.name in arguments
    } | ({"cluster": "M"} if "cluster" in arguments else {})


def test_every_option_is_a_key_of_the_projects_resources_table_and_its_kind_is_checked(tmp_path: Path):
    pyproject = tmp_path / "pyproject.toml"
    lines = [f"{option.flag} = {_toml(VALUES[option.kind])}" for option in RESOURCE_OPTIONS]
    pyproject.write_text("[tool.hpcbox.resources]\n" + "\n".join(lines) + "\n")
    request = project_defaults(pyproject, "local")
    for option in RESOURCE_OPTIONS:
        expected = VALUES[option.kind]
        assert getattr(request, option.name) == (tuple(expected) if option.kind is tuple else expected)
    for option in RESOURCE_OPTIONS:
        wrong = '"x"' if option.kind is not str else "1"
        pyproject.write_text(f"[tool.hpcbox.resources]\n{option.flag} = {wrong}\n")
        with pytest.raises(FieldError, match=f"tool.hpcbox.resources.{option.flag}"):
            project_defaults(pyproject, "local")


def test_every_option_with_an_sbatch_option_is_in_the_header_and_the_srun_ones_in_the_shell():
    profile = profiles.load_profile("local")
    resources = resolve(profile, SLURM_JOB)
    header = renderer(profile)(profile, resources, JobInputs.defaults("trainer"), ()).text
    header = header.split("\n\n", 1)[0]
    written = [line.split()[1].split("=")[0] for line in header.splitlines() if line.startswith("#SBATCH")]
    table = [option.sbatch for option in RESOURCE_OPTIONS if option.sbatch]
    # in the table's order, each once, with hpcbox's own lines after them
    assert written[: len(table)] == table
    srun = shlex.split(render_shell(profile, resources, "/images/x.sif", "/code/x").splitlines()[-1])
    given = [word.split("=")[0] for word in srun[1 : srun.index("apptainer")] if word.startswith("--")]
    assert [name for name in given if name not in ("--ntasks", "--pty", "--gres", "--gpus-per-node")] == [
        option.sbatch for option in RESOURCE_OPTIONS if option.srun
    ]


def test_every_option_with_a_bsub_flag_is_in_an_lsf_sites_header():
    profile = profiles.load_profile("dtu")
    header = renderer(profile)(profile, resolve(profile, LSF_JOB), JobInputs.defaults("trainer"), ()).text
    flags = {line.split()[1] for line in header.splitlines() if line.startswith("#BSUB")}
    for option in RESOURCE_OPTIONS:
        for flag in option.bsub.split():
            assert flag in flags, option.name


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(f'"{item}"' for item in value) + "]"
    return f'"{value}"' if isinstance(value, str) else str(value)
