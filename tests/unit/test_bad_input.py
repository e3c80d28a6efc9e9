"""Bad input across the whole command line, as users type it: one line saying what is wrong, a non-zero
exit, and nothing half-done (no file in the project, no job in the ledger, no image tagged).

And every free-text field fed arbitrary strings: refused in one line, or rendered into a script bash
reads (`bash -n`) with the value on one #SBATCH line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcbox.errors import FieldError
from hpcbox.project.command import EXAMPLE_TRAINER
from hpcbox.render import profiles
from hpcbox.render.resources import ResourceRequest, resolve
from hpcbox.render.sbatch import JobInputs, render_sbatch

REPO = Path(__file__).resolve().parents[2]

CASES = [
    # profiles, partitions, GPUs
    (["sbatch", "--cluster=nowhere"], "cluster: no profile named 'nowhere'"),
    (["sbatch", "--cluster=edi", "--partition=nope"], "partition: 'nope' is not a partition of"),
    (["sbatch", "--cluster=alliance", "--gpus=1", "--gpu-type=k80"], "gpu_type: partition 'auto' has no"),
    (["sbatch", "--cluster=edi", "--gpus=-1"], "gpus: -1 is below 0"),
    (["sbatch", "--cluster=edi", "--gpus=two"], "gpus: 'two' is not a whole number"),
    (["sbatch", "--cluster=edi", "--cpus=0"], "cpus: 0 is below 1"),
    (["sbatch", "--cluster=edi", "--nodes=0"], "nodes: 0 is below 1"),
    # times and sizes
    (["sbatch", "--cluster=edi", "--time=8-00:00:00"], "time: 8-00:00:00 exceeds the limit of partition"),
    (["sbatch", "--cluster=edi", "--time=0"], "time: '0' is zero, which Slurm reads as no limit"),
    (["sbatch", "--cluster=edi", "--mem=lots"], "mem: 'lots' is not a Slurm memory size"),
    (["sbatch", "--cluster=edi", "--sync-every=0:01"], "sync_every: '0:01' is under 5 s"),
    (["sbatch", "--cluster=edi", "--max-restarts=1000"], "max_restarts: 1000 is above 100"),
    # quotes, $(), backticks and newlines in free text
    (["sbatch", "--cluster=edi", "--job-name=a\nb"], "job_name: 'a\\nb' contains control characters"),
    (["sbatch", "--cluster=edi", "--partition=gpu\n#SBATCH --x"], "partition: 'gpu\\n#SBATCH --x' is not a"),
    (["sbatch", "--cluster=edi", "--mail-user=x$(reboot)"], "mail_user: 'x$(reboot)' is not an e-mail"),
    (["sbatch", "--cluster=edi", "--mail-user=a@b.c", "--mail-type=END\nFAIL"], "mail_type: 'END\\nFAIL'"),
    (["sbatch", "--cluster=edi", "--qos=$(id)"], "qos: '$(id)' is not a QOS name"),
    (["sbatch", "--cluster=edi", "--account=a`b`"], "account: 'a`b`' is not a Slurm account name"),
    (["sbatch", "--cluster=edi", "--array=1-3;rm"], "array: '1-3;rm' is not a job array spec"),
    (["sbatch", "--cluster=edi", "--extra=--comment=a\nb"], "extra: '--comment=a\\nb' is not one sbatch"),
    (["sbatch", "--cluster=edi", "--extra=--wrap=hostname"], "extra: --wrap replaces the job script"),
    (["sbatch", "--cluster=edi", "--log=logs/a\n.out"], "log: 'logs/a\\n.out' is empty or contains control"),
    (["sbatch", "--cluster=edi", "--log=logs/%j/out"], "log: 'logs/%j/out': %j in the folder"),
    # the container
    (["sbatch", "--cluster=edi", "--container=docker"], "container: 'docker' (allowed: apptainer,"),
    (["sbatch", "--cluster=edi", "--home=relative"], "home: 'relative': use absolute paths"),
    (["sbatch", "--cluster=edi", "--bind=/a:/b:/c:/d"], "bind: '/a:/b:/c:/d': '/c:/d' is not a bind option"),
    # site rules
    (["sbatch", "--cluster=carc", "--account=$(id)"], "account: '$(id)' is not a Slurm account name"),
    (["submit", "--cluster=dtu"], "dtu uses LSF: hpcbox renders its bsub script"),
    (["sbatch", "--cluster=edi", "--check"], "--check cannot reach cluster 'edi'"),
    # what a submit needs, before anything is sent
    (["submit", "--cluster=edi", "--data=missing.tar", "--dry-run"], "data: "),
    (["submit", "--cluster=edi", "--via=elsewhere"], "via: 'elsewhere' is not a place to rehearse a job"),
    (["submit", "--cluster=edi", "--host=-oProxyCommand=id"], "host: '-oProxyCommand=id' begins with '-'"),
    (["doctor", "--cluster=edi", "--host=-oProxyCommand=id"], "host: '-oProxyCommand=id' begins with '-'"),
    (["profile.draft", "-o", "site.toml", "--host=-oProxyCommand=id"], "host: '-oProxyCommand=id' begins"),
    (["submit", "--cluster=local", "--data=missing.tar"], "the mini cluster hpcbox-local is not up"),
    # a race, before anything is built or sent
    (["submit", "--cluster=edi,edi"], "cluster: edi is named twice in the race"),
    (["submit", "--cluster=edi,"], "cluster: 'edi,' names an empty cluster"),
    (["submit", "--cluster=edi,carc", "--sweep=sweep.toml"], "--sweep does not go with a race"),
    (["submit", "--cluster=edi,carc", "--mem=lots"], "mem: 'lots' is not a Slurm memory size"),
    (["submit", "--cluster=edi", "--account=a1,$(id)"], "account: '$(id)' is not a Slurm account name"),
    (["submit", "--cluster=edi,carc", "--first=soon"], "first: 'soon' is not a Slurm time"),
    (["submit", "--cluster=edi", "--first=10"], "--first picks among several clusters or accounts"),
    (["submit", "--cluster=edi", "--gpus=2", "--offline", "--data=pyproject.toml"],
     "environment is the cpu flavour (the flavour --offline builds unless told)"),
    # the example trainer's own arguments, which it would refuse on the node after the queue's wait
    (["submit", "--cluster=edi", "--", "--lr", "abc"], "arguments: the trainer cannot take 'abc' for --lr:"),
    (["sbatch", "--cluster=edi", "--", "--epocs", "3"], "arguments: the trainer has no option --epocs (did"),
    (["submit", "--cluster=edi", "--", "--epochs", "3", "4"], "arguments: '4' is not an option of the"),
    # words after `--` to a command that runs no program with them
    (["status", "-j", "1", "--", "foo"], "status takes no words after `--` (foo)"),
    (["cluster.status", "--", "foo"], "cluster.status takes no words after `--` (foo)"),
    (["cluster.shell", "--", "ls"], "cluster.shell takes no words after `--` (ls)"),
    (["profile.draft", "--output=edi2.toml", "--", "x"], "profile.draft takes no words after `--` (x)"),
    (["shell", "--cluster=edi", "--command=ls", "--", "ls"], "shell: give the command once"),
    # the job's life after it, with no job
    (["status", "-j", "999999"], "job 999999 was not submitted from this project"),
    (["fetch"], "no job was submitted"),
    (["watch"], "no job was submitted"),
    (["watch", "--every=0"], "every: '0' is not a number of seconds over 0"),
    (["status", "--cluster=lcoal"], "cluster: no profile named 'lcoal' (did you mean local?)"),
    (["jobs", "--cluster=lcoal"], "cluster: no profile named 'lcoal' (did you mean local?)"),
    (["cancel", "-j", "42"], "job 42 was not submitted from this project"),
    (["notebook", "--cluster=edi", "-j", "42"], "job: -j names the notebook to reach with --attach"),
    (["notebook", "--cluster=edi", "--attach"], "no notebook was started on edi from this project"),
    (["collect", "--sweep-dir=multirun/nowhere"], "multirun/nowhere holds no multirun sent with"),
    (["collect"], "hpcbox collect needs --sweep-dir"),
    (["verify"], "hpcbox verify needs --artifact"),
    (["notebook", "--cluster=edi", "--attach", "-j", "42"], "job 42 on cluster edi was not submitted from"),
    (["notebook", "--cluster=lsfsite"], "cluster: no profile named 'lsfsite'"),
    # images and SIFs
    (["build", "--flavour=rocm"], "unknown flavour 'rocm'"),
    (["sif", "--compression=brotli"], "--compression: unknown compression 'brotli'"),
    (["sif", "--image=hpcbox-missing/nothing:1", "--compression=zstd:99"], "--compression: "),
    (["verify", "--artifact=missing.sif"], "no SIF at missing.sif"),
    (["init", "--script=a.py", "--module=b"], "give one of --module, --script and --entry-point"),
    (["init", "--from-notebook=missing.ipynb"], "--from-notebook: missing.ipynb does not exist"),
    # drafting a profile, before anything is reached
    (["profile.draft", "-o", "site.toml"], "host: give one of --host (the site's login node) and --via"),
    (["profile.draft", "-o", "site.txt", "--host=login.example.edu"], "output: 'site.txt' is not a profile"),
    (["profile.draft", "-o", "pyproject.toml", "--host=login.example.edu"], "output: pyproject.toml exists"),
    (["profile.draft", "-o", "missing/site.toml", "--host=h"], "output: missing is not a folder"),
    (["profile.draft", "-o", "site.toml", "--via=local"], "the mini cluster hpcbox-local is not up"),
    (["profile.draft", "-o", "site.toml", "--via=elsewhere"], "via: 'elsewhere' is not a place hpcbox"),
]  # fmt: skip


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    """A copy of this repository's project inputs, with no state, no user profiles, no mini cluster."""
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy2(REPO / "pyproject.toml", root)
    shutil.copytree(REPO / "docker", root / "docker")
    shutil.copytree(REPO / "src" / "hpctrain", root / "src" / "hpctrain")
    return root


def hpcbox(project: Path, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SBATCH_", "HPCBOX_"))}
    clean.update(
        HPCBOX_CLUSTERS_DIR=str(project.parent / "no-user-profiles"),
        HPCBOX_MINICLUSTER_STATE=str(project.parent / "no-cluster"),
        **env,
    )
    return subprocess.run(
        [sys.executable, "-m", "hpcbox", *args], cwd=project, env=clean, capture_output=True, text=True
    )


def files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("args", "says"), CASES, ids=[" ".join(args) for args, _ in CASES])
def test_bad_input_is_one_line_and_leaves_nothing(project: Path, args: list[str], says: str):
    before = files(project)
    done = hpcbox(project, args)
    assert done.returncode == 1, done.stdout + done.stderr
    first, *rest = done.stderr.splitlines()
    assert first.startswith("error: ") and says in first, done.stderr
    assert all(line.startswith("  hint: ") for line in rest), done.stderr  # a hint at most, no traceback
    assert done.stdout == ""
    assert files(project) == before  # no script, no ledger entry, no state of any kind


def test_a_host_that_does_not_resolve_is_one_line_and_its_hint(project: Path, tmp_path: Path):
    """ssh's own line is the error's: not said again with ssh's command line before it."""
    done = hpcbox(
        project, ["profile.draft", "-o", str(tmp_path / "site.toml"), "--host=no-such-host.invalid"]
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith(
        "error: failed to connect to no-such-host.invalid: ssh: "
    ), done.stderr
    assert lines[1].startswith("  hint: ") and not (tmp_path / "site.toml").exists()


def test_cases_cover_at_least_25_kinds_of_bad_input():
    assert len(CASES) >= 25


def test_no_docker_engine_is_one_line_before_anything_is_built(project: Path):
    before = files(project)
    done = hpcbox(project, ["build", "--offline"], DOCKER_HOST="unix:///nonexistent/docker.sock")
    assert done.returncode == 1
    assert done.stderr.splitlines()[0] == "error: no Docker engine answers at unix:///nonexistent/docker.sock"
    assert files(project) == before


# Any text at all, but the NUL byte no argument can carry.
ANY_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=25
)
FREE_TEXT_FIELDS = (
    "job_name", "partition", "gpu_type", "account", "qos", "mail_user", "log", "error_log", "home", "time",
    "mem", "array",
)  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(FREE_TEXT_FIELDS), value=ANY_TEXT, extra=ANY_TEXT, bind=ANY_TEXT)
def test_any_string_in_any_field_is_refused_in_one_line_or_rendered_safely(
    field: str, value: str, extra: str, bind: str
):
    profile = profiles.load_profile("edi")
    request = ResourceRequest(**{"job_name": "x", field: value, "extra": (extra,), "bind": (bind,)})
    try:
        checked = resolve(profile, request)
        script = render_sbatch(profile, checked, JobInputs.defaults("trainer"), (), EXAMPLE_TRAINER)
    except FieldError as refused:
        assert "\n" not in refused.message and refused.field in {field, "extra", "bind"}
        return
    assert subprocess.run(["bash", "-n"], input=script.text, text=True, capture_output=True).returncode == 0
    lines = script.text.splitlines()
    leading = lines[: next(i for i, line in enumerate(lines) if line and not line.startswith("#"))]
    # sbatch reads directives up to the first command: every one is there, none was slipped in after
    assert [line for line in lines if line.startswith("#SBATCH")] == [
        line for line in leading if line.startswith("#SBATCH")
    ]
