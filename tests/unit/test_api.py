"""hpcbox as a library (hpcbox.api): importable without Docker or invoke, the CLI's own output, and bad
input refused in one line before anything is made. Its jobs' life on a real cluster is in
tests/integration/test_api.py."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

import hpcbox
from hpcbox.api.site import SHELL_RESOURCE_NAMES, Prepared
from hpcbox.render.options import RESOURCE_OPTIONS

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("docker", "invoke", "testcontainers", "spython", "matplotlib", "yaml")


def python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, check=False)


def test_a_script_from_the_api_is_the_clis_and_loads_neither_docker_nor_invoke():
    """What a notebook pays for `import hpcbox` and a script: no Docker SDK, no invoke, no plotting."""
    code = f"""
import json, sys
import hpcbox
script = hpcbox.Site("edi").script(["--epochs", "2"], gpus=1, time="1:00:00", job_name="api")
loaded = sorted({{name.split(".")[0] for name in sys.modules}} & set({HEAVY!r}))
print(json.dumps({{"text": script.text, "loaded": loaded}}))
"""
    made = python(code, REPO)
    assert made.returncode == 0, made.stderr
    found = json.loads(made.stdout)
    assert found["loaded"] == []
    cli = subprocess.run(
        [sys.executable, "-m", "hpcbox", "sbatch", "--cluster=edi", "--gpus=1", "--time=1:00:00",
         "--job-name=api", "--", "--epochs", "2"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    # Byte for byte, but for the line naming when it was rendered.
    assert _undated(found["text"]) == _undated(cli.stdout)
    assert "#SBATCH --gres=gpu:1" in found["text"] and "#SBATCH --job-name=api" in found["text"]


def _undated(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("# Rendered by hpcbox")]


@pytest.fixture
def bare_project(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "apitest"\n')
    return tmp_path


@pytest.mark.parametrize("call", ["script", "submit"])
def test_a_misspelt_resource_option_is_refused_with_the_valid_names_before_anything_is_made(
    bare_project: Path, call: str
):
    site = hpcbox.Site("edi", project=bare_project)
    with pytest.raises(hpcbox.FieldError) as refused:
        getattr(site, call)(["--epochs", "1"], tiem="1:00:00")
    assert refused.value.field == "tiem"
    names = [option.name for option in RESOURCE_OPTIONS]
    assert f"allowed: {', '.join(sorted(names))})" in refused.value.message
    assert sorted(path.name for path in bare_project.iterdir()) == ["pyproject.toml"]


def test_a_submit_refuses_what_was_prepared_for_another_compression_before_anything_is_sent(
    bare_project: Path,
):
    from hpcbox.store.ship import CodeSnapshot, Dataset, Payload

    made = Payload(
        Path("e.sif"),
        "ab" * 32,
        1,
        CodeSnapshot("cd" * 32, b"", 0),
        Dataset(Path("d"), "ef"),
        "cpu",
        "zstd:3",
    )
    with pytest.raises(hpcbox.FieldError) as refused:
        hpcbox.Site("edi", project=bare_project).submit(prepared=Prepared(made, "i:1"))
    assert refused.value.field == "prepared"
    assert refused.value.message == "prepared: made with zstd:3 SIFs; edi reads gzip:1"
    assert sorted(path.name for path in bare_project.iterdir()) == ["pyproject.toml"]


def test_a_shell_refuses_a_batch_only_option_by_name(bare_project: Path):
    batch_only = next(option.name for option in RESOURCE_OPTIONS if not option.in_shell)
    with pytest.raises(hpcbox.FieldError) as refused:
        hpcbox.Site("local", project=bare_project).resources({batch_only: "1"}, allowed=SHELL_RESOURCE_NAMES)
    assert refused.value.field == batch_only


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda root: hpcbox.Site("nowhere", project=root), "cluster: no profile named 'nowhere'"),
        (lambda root: hpcbox.Site("edi", port="22x", project=root), "port: '22x' is not a TCP port"),
        (lambda root: hpcbox.Site("edi", via="cloud", project=root).target, "via: 'cloud' is not a place"),
        (lambda root: hpcbox.Job.find(project=root), "no job was submitted"),
        (lambda root: hpcbox.Site("edi", project=root).job("12"), "job 12 on cluster edi was not submitted"),
        (lambda root: hpcbox.Project(root).sif(compression="brotli"), "compression: unknown compression"),
        (lambda root: hpcbox.Project(root).sif(), "the image is not built"),
        (lambda root: hpcbox.Project(root).build("rocm"), "unknown flavour 'rocm'"),
    ],
)
def test_bad_input_to_the_api_is_one_error_naming_it(bare_project: Path, make, said: str):
    with pytest.raises(hpcbox.HpcboxError) as refused:
        make(bare_project)
    assert refused.value.message.startswith(said), refused.value.message


def test_a_project_locks_its_requirements_and_says_what_changed_through_its_own_say(tmp_path: Path):
    """`hpcbox.Project(root).lock(pip_only=True)`, as `hpcbox lock --pip-only` is: real uv against the
    package index; its progress lines go where the caller says, not to stdout."""
    (tmp_path / "requirements.txt").write_text("tabulate==0.9.0\n")
    (tmp_path / "train.py").write_text("import tabulate\n")
    subprocess.run([sys.executable, "-m", "hpcbox", "init"], cwd=tmp_path, check=True, capture_output=True)
    said: list[str] = []
    project = hpcbox.Project(tmp_path, say=said.append)
    changed = project.lock(pip_only=True)
    lock = tmp_path / "docker" / "lock"
    assert sorted(changed) == [lock / "cpu-requirements.txt", lock / "cuda-requirements.txt"]
    assert "tabulate==0.9.0" in (lock / "cpu-requirements.txt").read_text()
    assert said[0] == "hpcbox: dependencies from requirements.txt (pip requirements)", said
    assert project.lock(pip_only=True) == []  # nothing changed the second time


def test_the_api_s_names_are_what_hpcbox_exports():
    import hpcbox.api

    assert hpcbox.Site is hpcbox.api.Site and hpcbox.Job is hpcbox.api.Job
    assert hpcbox.Project is hpcbox.api.Project
    assert {"Site", "Job", "Project", "HpcboxError", "FieldError"} <= set(dir(hpcbox))
    with pytest.raises(AttributeError):
        hpcbox.Nothing  # noqa: B018


def test_a_site_stands_on_a_profile_in_hand_and_the_login_it_is_given(bare_project: Path, tmp_path: Path):
    """`Site(profile, login=...)`: a profile loaded and changed (here, GPU nodes of 8) is the one its
    requests are checked against, and the given login (a key of its own) is the one reached."""
    from hpcbox.api import Target

    local = hpcbox.Site("local", project=bare_project).profile
    with pytest.raises(hpcbox.FieldError):
        hpcbox.Site(local, project=bare_project).resources({"gpus": 8})
    eight = dataclasses.replace(local.partition("gpu"), gpus_per_node=8, default=True)
    login = Target("login.example.org", 2200, "someone", key_path=tmp_path / "ci_key")
    site = hpcbox.Site(
        dataclasses.replace(local, partitions=(eight,)), login=login, cache=tmp_path, project=bare_project
    )
    assert site.resources({"gpus": 8}).gpus == 8
    assert site.target == login and site.cache == tmp_path
    rehearsal = site.at(dataclasses.replace(site.place, via="local"))
    assert rehearsal.profile is site.profile and rehearsal.cache == tmp_path


def test_a_sites_jobs_are_reached_through_the_login_it_was_given(bare_project: Path, tmp_path: Path):
    """A job's record names the login node it was sent to; `site.job()`, `jobs()` (and `shell()`,
    `resubmit_failed()`, through `Site.at`) reach it with the key the Site was given, not with what
    ~/.ssh/config would pick for that host."""
    from hpcbox.api import Target

    key, hosts = tmp_path / "ci_key", tmp_path / "hosts"
    login = Target("login.edi.ac.uk", 22, "s1234", key_path=key, known_hosts=hosts)
    site = hpcbox.Site("edi", login=login, project=bare_project)
    _recorded(site, "41", sent=(), bytes_sent=0)
    found = site.job("41")
    assert found.site.place != site.place  # where the record says it ran: a Site of its own
    assert found.site.target == login and found.site.login == login
    assert [job.site.target for job in site.jobs()] == [login]


def test_a_rehearsed_job_is_reached_on_the_mini_cluster_it_ran_on_of_several(bare_project: Path):
    """Two rehearsals up at once, each on a mini cluster of its own: a job is reached on the one its
    record names, whichever the Site was made for (HPCBOX_MINICLUSTER, or none)."""

    site = hpcbox.Site("m3", via="local", mini_cluster="rehearsal-a", project=bare_project)
    ran_on = {"host": "researcher@127.0.0.1:40022", "via": "local", "mini_cluster": "rehearsal-b"}
    _recorded(site, "5", cluster="m3", **ran_on)
    assert site.job("5").site.mini_cluster == "rehearsal-b"
    assert [job.site.mini_cluster for job in site.jobs()] == ["rehearsal-b"]
    assert hpcbox.Site("m3", via="local", project=bare_project).job("5").site.mini_cluster == "rehearsal-b"


def _recorded(site, job_id: str, **fields) -> None:
    """Job ``job_id`` in the ledger of ``site``'s project, as a submit to edi records it, but ``fields``."""
    from hpcbox import jobs

    recorded = jobs.JobRecord(
        job_id=job_id, cluster="edi", host="s1234@login.edi.ac.uk:22",
        submitted_at="2026-11-23T10:00:00+00:00",
        submit_dir="/home/s1234/hpcbox/apitest", script=f"/home/s1234/hpcbox/apitest/scripts/{job_id}.sh",
        log=f"/home/s1234/hpcbox/apitest/logs/x-{job_id}.out",
        run_dir=f"/home/s1234/hpcbox/apitest/runs/{job_id}", sif="/home/s1234/hpcbox/images/sha256/ab.sif",
        sif_sha256="ab" * 32, image="hpcbox/apitest:0123", code_revision="0123abc", code_snapshot="cd" * 32,
        dataset_sha256=None, resources={}, trainer_args=(),
    )  # fmt: skip
    jobs.Ledger(site.project).add(dataclasses.replace(recorded, **fields), "#!/bin/bash\n")


def test_resuming_with_settings_its_checkpoints_were_not_written_with_is_refused_before_anything_is_made(
    bare_project: Path,
):
    """Found as a user: `--resume-from=4 -- --epochs 2` of a job run with `--epochs 1000` was built,
    sent and scheduled, and the trainer refused on the node. hpcbox knows both argument lists."""
    site = hpcbox.Site("edi", project=bare_project)
    earlier = ("--epochs", "1000", "--lr", "5e-2", "--seed", "3")
    _recorded(site, "4", trainer_args=earlier, options={"time": "5"})
    before = sorted(path.relative_to(bare_project) for path in bare_project.rglob("*"))
    for args, differences in [
        (["--epochs", "2", "--lr=0.05", "--seed", "3"], "--epochs 1000, now 2"),
        (["--epochs=1000", "--lr", "0.05"], "--seed 3, now 0 (left out: the default)"),
        (["--epochs=1000", "--seed=3", "--model", "resnet18"], "--model cnn (the default), now resnet18"),
    ]:
        with pytest.raises(hpcbox.FieldError) as refused:
            site.submit(args, resume_from="4")
        assert refused.value.field == "resume_from"
        assert refused.value.message == (
            f"resume_from: job 4's checkpoints were written with other settings: {differences}"
        )
    assert sorted(path.relative_to(bare_project) for path in bare_project.rglob("*")) == before


def test_the_example_trainers_settings_kept_on_resume_and_their_defaults_are_the_trainers_own():
    from hpcbox.project.command import EXAMPLE_TRAINER_RESUME_SETTINGS
    from hpctrain import config

    defaults = {option.flag: option.default for option in config.OPTIONS}
    assert list(EXAMPLE_TRAINER_RESUME_SETTINGS) == [
        f"--{name.replace('_', '-')}" for name in config.RESUME_INVARIANTS
    ]
    for flag, default in EXAMPLE_TRAINER_RESUME_SETTINGS.items():
        assert (default if default is None else type(defaults[flag])(default)) == defaults[flag], flag
