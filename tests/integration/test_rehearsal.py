"""Rehearsal clusters: the mini cluster shaped like each site's profile (`invoke cluster.up --like`).

Each profile's own script (its golden request, with the mini cluster's account where it names one) is
accepted by `sbatch --test-only` on a Slurm configured like the site: its partitions and time limits,
its GPU types, its account and QOS rules; and by `hpcbox sbatch --check --via local` as the site would
write it (its own account names, none where the profile only assumes one is required). What the
site's Slurm would refuse by a rule the profile states, the rehearsal refuses too, by Slurm's own
answer; a rule the profile only assumes (carc's and m3's account, m3's GPU type) refuses nothing, and a
job without an account goes to the user's default one. `edi` and `m3` (typed GPUs) run the trainer end
to end through the commands a user types: `invoke submit --cluster NAME --via local`, logs, fetch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcbox import jobs, minicluster
from hpcbox.errors import HpcboxError
from hpcbox.minicluster.shape import RULES
from hpcbox.project.config import load_project
from hpcbox.render import profiles
from hpcbox.render.resources import resolve
from hpcbox.render.sbatch import JobInputs, render_sbatch
from hpcbox.survey import draft
from hpcbox.tools import slurm
from tests.fixtures.cluster import free_port
from tests.fixtures.submitting import (
    TEN_RESTING_STEPS,
    PreemptibleCall,
    Setup,
    picks_node1,
    runs_in_accounting,
    started_within_grace,
    until_logged,
    user_signal_profile,
    with_own_ledger,
)
from tests.integration.test_doctor import verdicts
from tests.integration.test_sbatch_cluster import ACCOUNT, scratch_left, wait_finished
from tests.integration.test_submit import (
    SHORT,
    dropping_port,
    finished,
    invoke,
    log_of,
    picked_two_node_training,
    resumed_as_never_stopped,
    submit,
    sweep_project,
)
from tests.unit.test_render import GOLDEN_REQUESTS, TRAINER_ARGS

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

SLURM_PROFILES = sorted(name for name in GOLDEN_REQUESTS if profiles.load_profile(name).scheduler == "slurm")


class Rehearsals:
    """One rehearsal cluster at a time, brought up on first use and taken down for the next shape."""

    def __init__(self, run_id: str, state: Path) -> None:
        self.run_id, self.state = run_id, state
        self.current: minicluster.Cluster | None = None

    def like(self, profile: str) -> minicluster.Cluster:
        if self.current is not None and self.current.spec.like == profile:
            return self.current
        self.close()
        spec = minicluster.spec_like(profile, name=f"{self.run_id}-like", port=free_port())
        try:
            self.current = minicluster.up(spec, self.state)
        except BaseException:
            minicluster.down(spec.name, self.state)
            raise
        return self.current

    def close(self) -> None:
        if self.current is not None:
            minicluster.down(self.current.name, self.state)
            self.current = None


@pytest.fixture(scope="module")
def setup(project_setup: Setup) -> Setup:
    """The session's project, dataset and SIF; every command here names its rehearsal in
    HPCBOX_MINICLUSTER, so no session cluster is started for this module."""
    return project_setup


@pytest.fixture(scope="module")
def rehearsals(run_id: str, docker_engine, minicluster_state: Path) -> Iterator[Rehearsals]:
    made = Rehearsals(run_id, minicluster_state)
    try:
        yield made
    finally:
        made.close()


def golden_script(name: str, **changes) -> str:
    """The profile's golden job script, with the rehearsal cluster's account where it names one."""
    profile = profiles.load_profile(name)
    request = GOLDEN_REQUESTS[name]
    request = dataclasses.replace(request, account=ACCOUNT if request.account else None, **changes)
    return render_sbatch(profile, resolve(profile, request), JobInputs.defaults("trainer"), TRAINER_ARGS).text


def refused(cluster, text: str) -> str:
    with pytest.raises(HpcboxError) as caught:
        slurm.test_only(cluster.ssh_target(), text)
    return caught.value.message


def without(text: str, option: str) -> str:
    """The script without its `#SBATCH <option>...` line, as a user's hand edit would leave it."""
    kept = [line for line in text.splitlines() if not line.startswith(f"#SBATCH {option}")]
    assert len(kept) < len(text.splitlines()), f"no #SBATCH {option} line"
    return "\n".join(kept) + "\n"


def job_ids(cluster) -> set[str]:
    return set(cluster.ssh(["squeue", "--noheader", "--format=%i"], check=True).stdout.split())


def takes_a_job_without_an_account_on_the_users_default_account(rehearsals, setup: Setup, name: str) -> None:
    """The profile only assumes an account is required: the site's script without one passes `hpcbox
    sbatch --check` with one warning line on the account, Slurm takes it and charges the user's default
    account; an account the user is not in is still refused, by Slurm's own answer."""
    cluster = rehearsals.like(name)
    assert "accounting.account_required" in dict(profiles.load_profile(name).assumed)
    flags = [flag for flag in own_flags(GOLDEN_REQUESTS[name]) if not flag.startswith("--account=")]
    env = {"HPCBOX_MINICLUSTER": cluster.name}
    checked = invoke(setup, "sbatch", f"--cluster={name}", "--via=local", "--check", *flags, env=env)
    assert checked.returncode == 0 and "to start at" in checked.stderr, checked.stderr
    warnings = [line for line in checked.stderr.splitlines() if line.startswith("hpcbox: warning: account: ")]
    assert len(warnings) == 1, checked.stderr
    assert f"account: cluster {name!r} requires an account, by the profile's assumption" in warnings[0]
    assert "the job goes to your default account, and the site's sbatch decides" in warnings[0]
    text = golden_script(name)
    assert "to start at" in slurm.test_only(cluster.ssh_target(), without(text, "--account"))
    job = cluster.ssh(
        ["sbatch", "--parsable", "--output=/dev/null", "--wrap", "true"], check=True
    ).stdout.strip()
    assert wait_finished(cluster, job, timeout_s=120) == ("COMPLETED", "0:0")
    accounted = cluster.ssh(["sacct", "-X", "-n", "-P", "-j", job, "-o", "account"], check=True)
    assert accounted.stdout.split() == [ACCOUNT]  # the user's default account in the rehearsal
    unknown = text.replace(f"--account={ACCOUNT}", "--account=someone-else")
    assert "invalid account" in refused(cluster, unknown).lower()


def own_flags(request) -> list[str]:
    """`hpcbox sbatch`'s flags for ``request``, as a user types them."""
    flags = []
    for field in dataclasses.fields(request):
        value = getattr(request, field.name)
        for one in value if isinstance(value, tuple) else () if value is None else (value,):
            flags.append(f"--{field.name.replace('_', '-')}={one}")
    return flags


def test_every_profiles_own_script_passes_sbatch_test_only_on_a_cluster_shaped_like_it(
    rehearsals, setup: Setup, tmp_path: Path
):
    """And `hpcbox sbatch --check --via local` takes it as the site writes it: with the site's own account
    names (added to the rehearsal's accounting as a member's), and without one where the profile only
    assumes it is required. `hpcbox doctor` finds each rehearsal as its profile describes the site,
    line by line; and `hpcbox profile.draft` drafts from it a profile that renders the profile's own
    script (as_told)."""
    # Alliance last: the next test runs on its shape.
    for name in sorted(SLURM_PROFILES, key=lambda profile: profile == "alliance"):
        cluster = rehearsals.like(name)
        answer = slurm.test_only(cluster.ssh_target(), golden_script(name))
        assert "to start at" in answer, f"{name}: {answer}"
        shown = minicluster.status(cluster)
        assert f"shaped like profile {name!r}" in shown
        env = {"HPCBOX_MINICLUSTER": cluster.name}
        written = own_flags(GOLDEN_REQUESTS[name])
        assumed = "accounting.account_required" in dict(profiles.load_profile(name).assumed)
        for flags in [
            written,
            *([[f for f in written if not f.startswith("--account=")]] if assumed else []),
        ]:
            checked = invoke(setup, "sbatch", f"--cluster={name}", "--via=local", "--check", *flags, env=env)
            assert checked.returncode == 0 and "to start at" in checked.stderr, (
                f"{name} {flags}: {checked.stderr}"
            )
        doctor = invoke(setup, "doctor", f"--cluster={name}", "--via=local", env=env)
        assert doctor.returncode == 0 and set(verdicts(doctor.stdout)) == {"ok"}, (
            doctor.stdout + doctor.stderr
        )
        (tmp_path / name).mkdir()
        path = tmp_path / name / f"{name}.toml"
        drafted = invoke(setup, "profile.draft", "--via=local", "-o", str(path), "--probe-job", env=env)
        assert drafted.returncode == 0, drafted.stdout + drafted.stderr
        draft_tells_what_the_profile_knows(profiles.parse_profile_file(path), profiles.load_profile(name))
        shipped = profiles.load_profile(name)
        request = dataclasses.replace(
            GOLDEN_REQUESTS[name], account=ACCOUNT if GOLDEN_REQUESTS[name].account else None
        )
        told = as_told(path, shipped)
        inputs = JobInputs.defaults("trainer")
        mine = render_sbatch(told, resolve(told, request), inputs, TRAINER_ARGS).text
        assert mine == render_sbatch(shipped, resolve(shipped, request), inputs, TRAINER_ARGS).text, name


def draft_tells_what_the_profile_knows(drafted: profiles.ClusterProfile, shipped: profiles.ClusterProfile):
    """Each fact the shipped profile knows that a site reports, read back from the draft as the profile
    has it: its partitions, their defaults, limits, GPUs and QOS, the account, QOS and GPU-type rules,
    node scratch, the runtime."""
    assert [p.name for p in drafted.partitions] == [p.name for p in shipped.partitions]
    assert drafted.default_partition.name == shipped.default_partition.name
    for mine, theirs in zip(drafted.partitions, shipped.partitions, strict=True):
        for fact in ("max_time_s", "gpus_per_node", "cpus_per_gpu", "qos"):
            if getattr(theirs, fact) is not None:
                assert getattr(mine, fact) == getattr(theirs, fact), (shipped.name, theirs.name, fact)
        if theirs.gpu_types is not None:
            assert set(mine.gpu_types or ()) == set(theirs.gpu_types), (shipped.name, theirs.name)
    # A rule the shipped profile only assumes refuses nothing in the rehearsal: the draft reads it as none.
    assumed = dict(shipped.assumed)
    for key, rule in RULES.items():
        assert getattr(drafted, rule) == (getattr(shipped, rule) and key not in assumed), (shipped.name, rule)
    if "storage.node_scratch" not in assumed:
        assert drafted.node_scratch == shipped.node_scratch
    assert drafted.apptainer.command == shipped.apptainer.command


def as_told(path: Path, shipped: profiles.ClusterProfile) -> profiles.ClusterProfile:
    """The profile drafted at ``path`` with what its site could not tell taken from ``shipped``: the
    conventions no Slurm reports (draft.CONVENTIONS, PARTITION_CONVENTIONS), what the draft names as
    assumed, whether compute nodes reach the internet, and the words for people (description, assumed,
    notes). A fact the shipped profile does
    not know (not given, or in an `unknown`) is left out of the draft too. What is left is what the
    site told, to render the same script as the shipped profile."""
    mine = tomllib.loads(path.read_text())
    theirs = tomllib.loads(shipped.source.read_text())

    def take(key: str, into: dict, source: dict) -> None:
        table, _, setting = key.rpartition(".")
        where, there = (into.setdefault(table, {}), source.get(table, {})) if table else (into, source)
        where.pop(setting, None)
        if setting in there:
            where[setting] = there[setting]

    assumed = (*mine.get("assumed", []), *theirs.get("assumed", []))
    # Whether compute nodes reach the internet, the rehearsal tells of this machine's network, not the
    # site's (the job scripts differ by it: trackers offline where they do not).
    for key in (*draft.CONVENTIONS, *assumed, "description", "assumed", "unknown", "compute_internet"):
        take(key, mine, theirs)
    for name in theirs.get("unknown", []):
        mine.pop(name, None)
    for table, settings in list(mine.items()):
        if isinstance(settings, dict):
            for setting in [key for key in settings if key not in theirs.get(table, {})]:
                del settings[setting]
    places = {p["name"]: p for p in theirs["partitions"]}
    for partition in mine["partitions"]:
        for key in (*draft.PARTITION_CONVENTIONS, "notes", "unknown"):
            take(key, partition, places[partition["name"]])
        for fact in places[partition["name"]].get("unknown", []):
            partition.pop(fact, None)
    return profiles.parse_profile(mine, name=shipped.name, source=path)


def test_alliance_has_its_gpu_types_and_sets_slurm_tmpdir_per_job(rehearsals):
    cluster = rehearsals.like("alliance")
    text = golden_script("alliance")
    assert "--gpus-per-node=a100:1" in text
    assert "to start at" in slurm.test_only(cluster.ssh_target(), text.replace("a100:1", "a100_3g.20gb:1"))
    assert "node configuration is not available" in refused(cluster, text.replace("a100:1", "k80:1"))
    # $SLURM_TMPDIR: a folder of the job's own on the node, there while it runs, gone after.
    job = cluster.ssh(
        [
            "sbatch",
            "--parsable",
            "--output=tmpdir-%j.out",
            "--wrap",
            'test -d "$SLURM_TMPDIR" && echo "$SLURM_TMPDIR"',
        ],
        check=True,
    ).stdout.strip()
    assert wait_finished(cluster, job, timeout_s=120) == ("COMPLETED", "0:0")
    assert cluster.ssh(["cat", f"tmpdir-{job}.out"]).stdout.strip() == f"/localscratch/researcher.{job}.0"
    for host in cluster.spec.compute_hosts:
        assert cluster.ask(host, ["ls", "-A", "/localscratch"]).stdout.strip() == ""


def test_sbatch_check_takes_the_users_own_account_the_profile_cannot_know(
    rehearsals,
    setup: Setup,
):
    """carc's profile cannot know the user's accounts: the rehearsal takes the one the user names, and
    Slurm's own check then passes, as at the site for a member of it."""
    cluster = rehearsals.like("carc")
    env = {"HPCBOX_MINICLUSTER": cluster.name}
    account = f"ttrojan_{uuid.uuid4().hex[:6]}"
    args = ("sbatch", "--cluster=carc", "--via=local", "--check", f"--account={account}", "--gpus=1")
    checked = invoke(setup, *args, "--time=1:00:00", env=env)
    assert checked.returncode == 0, checked.stderr
    assert "to start at" in checked.stderr
    assert f"the rehearsal's accounting has account {account} now" in checked.stderr
    again = invoke(setup, *args, "--time=1:00:00", env=env)  # known now: said once
    assert again.returncode == 0 and "has account" not in again.stderr, again.stderr
    assert cluster.ssh(["squeue", "--noheader"]).stdout.strip() == ""  # --test-only submits nothing


def test_a_gpu_type_the_profile_does_not_list_is_added_to_the_rehearsal_unless_jobs_would_end(
    rehearsals, setup: Setup
):
    """carc has several GPU models its profile does not list: a job naming one gets GPUs of that type
    in the rehearsal (restarting its nodes), which Slurm's own check then takes; not while a job runs."""
    cluster = rehearsals.like("carc")
    env = {"HPCBOX_MINICLUSTER": cluster.name}
    args = ("sbatch", "--cluster=carc", "--via=local", "--check", f"--account={ACCOUNT}", "--gpus=1")
    typed = invoke(setup, *args, "--gpu-type=v100", "--time=1:00:00", env=env)
    assert typed.returncode == 0, typed.stderr
    assert "carc's profile does not know its GPU types; the rehearsal adds v100 GPUs" in typed.stderr
    assert "to start at" in typed.stderr
    assert minicluster.find(cluster.name, rehearsals.state).shape.gpu_types == ("v100",)
    assert "gpu:v100:" in cluster.ssh(["sinfo", "--noheader", "--format=%G"], check=True).stdout
    again = invoke(setup, *args, "--gpu-type=v100", "--time=1:00:00", env=env)
    assert again.returncode == 0 and "adds" not in again.stderr, again.stderr
    untyped = invoke(setup, *args, "--time=1:00:00", env=env)  # any type will do, as at the site
    assert untyped.returncode == 0 and "to start at" in untyped.stderr, untyped.stderr
    running = cluster.ssh(
        ["sbatch", "--parsable", f"--account={ACCOUNT}", "--job-name=held", "--wrap", "sleep 300"], check=True
    ).stdout.strip()
    try:
        refused = invoke(setup, *args, "--gpu-type=a100", "--time=1:00:00", env=env)
        assert refused.returncode == 1, refused.stderr
        errors = [line for line in refused.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and "has no a100 GPUs, and adding them restarts its nodes" in errors[0]
        assert f"{running} 'held'" in errors[0], refused.stderr
        assert minicluster.find(cluster.name, rehearsals.state).shape.gpu_types == ("v100",)
    finally:
        cluster.ssh(["scancel", running], check=True)
        deadline = time.monotonic() + 60
        while running in job_ids(cluster) and time.monotonic() < deadline:
            time.sleep(0.5)


def test_carc_takes_its_own_script_without_an_account_on_the_users_default_account(rehearsals, setup: Setup):
    takes_a_job_without_an_account_on_the_users_default_account(rehearsals, setup, "carc")


def test_edi_refuses_a_time_above_its_partitions_limit_and_partitions_it_does_not_have(rehearsals):
    cluster = rehearsals.like("edi")
    text = golden_script("edi")
    over = re.sub(r"^#SBATCH --time=.*$", "#SBATCH --time=7-00:01:00", text, flags=re.M)
    assert "time limit" in refused(cluster, over).lower()
    elsewhere = text.replace("--partition=PGR-Standard", "--partition=gpu")
    assert "invalid partition" in refused(cluster, elsewhere).lower()


def test_a_rehearsal_of_another_shape_or_place_is_one_line_and_submits_nothing(rehearsals, setup: Setup):
    cluster = rehearsals.like("edi")
    env = {"HPCBOX_MINICLUSTER": cluster.name}
    for args, message in [
        (("--cluster=m3", "--via=local", f"--account={ACCOUNT}"), "shaped like 'edi', not 'm3'"),
        (("--cluster=edi", "--via=elsewhere"), "via: 'elsewhere' is not a place to rehearse a job"),
    ]:
        done = invoke(setup, "submit", *args, f"--data={setup.data}", "--time=10", env=env)
        assert done.returncode != 0
        errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and message in errors[0], done.stderr
    queued = cluster.ssh(["squeue", "--noheader"]).stdout
    assert queued.strip() == ""


def test_a_rehearsals_failed_points_run_again_on_the_rehearsal_unless_a_flag_says_elsewhere(
    rehearsals, setup: Setup, tmp_path: Path, run_id: str
):
    """`--resubmit-failed` of a sweep rehearsed with `--via local` reads the failed points on the mini
    cluster and sends their rerun there too, without `--via local` again: the job's record says where
    it ran. A --host saying otherwise is refused in one line, and nothing is submitted."""
    cluster = rehearsals.like("edi")
    project_dir = sweep_project(setup, tmp_path / "sweep")
    gate = f"/home/researcher/{run_id}-rehearsal-gate"
    (project_dir / "sweep.toml").write_text(
        f'[[points]]\nindex = 0\n[[points]]\nindex = 1\nneeds = "{gate}"\n'
    )
    env = {**os.environ, **setup.env, "HPCBOX_MINICLUSTER": cluster.name}

    def hpcbox(*args: str) -> subprocess.CompletedProcess[str]:
        flags = ("--cluster=edi", f"--data={setup.data}", "--flavour=cpu", "--cpus=1", "--mem=1G", "--time=5")
        return subprocess.run(
            [sys.executable, "-m", "hpcbox", "submit", *flags, *args],
            cwd=project_dir, env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip

    done = hpcbox("--via=local", "--sweep=sweep.toml")
    assert done.returncode == 0, done.stderr
    first = done.stdout.split()[-1]
    ledger = jobs.Ledger(load_project(project_dir))
    assert finished(cluster, ledger.find(first)).state == "FAILED"  # point 1 finds no gate

    queued = job_ids(cluster)
    refused = hpcbox(f"--resubmit-failed={first}", "--host=mlp.inf.ed.ac.uk")
    assert refused.returncode == 1 and refused.stdout == ""
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: host: job {first} ran on the mini cluster (edi-via-local); --host mlp.inf.ed.ac.uk says "
        "otherwise"
    ], refused.stderr
    assert job_ids(cluster) == queued and len(ledger.all()) == 1

    cluster.ssh(["touch", gate], check=True)
    again = hpcbox(f"--resubmit-failed={first}")  # no --via local: the record says where it ran
    assert again.returncode == 0, again.stderr
    assert f"1 of 2 tasks of job {first} again: 1" in again.stderr
    second = ledger.find(again.stdout.split()[-1], "edi-via-local")
    assert (second.cluster, second.via, second.resubmits) == ("edi", "local", first)
    assert finished(cluster, second).state == "COMPLETED"


@pytest.mark.parametrize(
    ("name", "flags"),
    [
        # The Edinburgh cluster-scripts' own log header: a folder of the user's, %u made by hpcbox.
        ("edi", ("--gpus=1", "--cpus=1", "--mem=2G", "--time=10", "--log=/home/%u/slogs/sl_%A.out")),
        # The user's own project account, which the rehearsal did not know (M3's profile lists none).
        ("m3", ("--gpus=1", "--gpu-type=V100", f"--account=vf68-{uuid.uuid4().hex[:6]}", "--time=10")),
    ],
)
def test_a_sites_job_runs_end_to_end_on_its_rehearsal(rehearsals, setup: Setup, name: str, flags):
    cluster = rehearsals.like(name)
    env = {"HPCBOX_MINICLUSTER": cluster.name}
    submitted = invoke(
        setup,
        "submit",
        f"--cluster={name}",
        "--via=local",
        f"--data={setup.data}",
        *flags,
        # The rehearsal's GPUs have no GPU behind them: the cpu environment, on the CPU, knowingly.
        "--flavour=cpu",
        "--",
        *SHORT,
        "--device",
        "cpu",
        env=env,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().splitlines()[-1]
    account = next((flag.split("=", 1)[1] for flag in flags if flag.startswith("--account=")), None)
    if account:
        assert f"the rehearsal's accounting has account {account} now" in submitted.stderr
        accounted = cluster.ssh(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "account"], check=True)
        assert accounted.stdout.split() == [account]
    followed = invoke(setup, "logs", "--follow", "-j", job_id, f"--cluster={name}-via-local", env=env)
    assert followed.returncode == 0, followed.stderr
    assert "the trainer exited with status 0" in followed.stdout, followed.stdout
    status = invoke(setup, "status", "-j", job_id, f"--cluster={name}-via-local", env=env)
    assert status.stdout.startswith(f"job {job_id}: COMPLETED"), status.stdout + status.stderr
    fetched = invoke(setup, "fetch", "-j", job_id, f"--cluster={name}-via-local", env=env)
    assert fetched.returncode == 0, fetched.stderr
    run_dir = Path(fetched.stdout.strip())
    assert run_dir == setup.project_dir / "runs" / f"{name}-via-local" / job_id
    assert '"event": "done"' in (run_dir / "metrics.jsonl").read_text()
    assert scratch_left(cluster, job_id) == []
    # The ledger knows it as a rehearsal, and the job ran the site's own script: its partition, its GPU.
    record = jobs.Ledger(setup.project()).find(job_id, f"{name}-via-local")
    assert (record.cluster, record.via) == (name, "local")
    script = cluster.ssh(["cat", record.script], check=True).stdout
    assert f"--partition={profiles.load_profile(name).default_partition.name}" in script
    assert ("gpu:V100:1" if name == "m3" else "--gres=gpu:1") in script
    if name == "edi":
        assert record.log == f"/home/researcher/slogs/sl_{job_id}.out"
        assert "#SBATCH --output=/home/%u/slogs/sl_%A.out" in script


def test_m3_takes_a_job_without_an_account_on_the_users_default_account(rehearsals, setup: Setup):
    takes_a_job_without_an_account_on_the_users_default_account(rehearsals, setup, "m3")


@contextlib.contextmanager
def accounts_one_at_its_limit(cluster: minicluster.Cluster) -> Iterator[tuple[str, str]]:
    """Two new accounts on a Slurm that enforces accounts' limits as M3's does: the first at its limit
    of running jobs (GrpJobs=1, held by a job of its own, running), the second free; (full, free)."""
    suffix = uuid.uuid4().hex[:6]
    full, free = f"vf68-full-{suffix}", f"vf68-free-{suffix}"
    cluster.add_account(full)
    limited = ["sacctmgr", "--immediate", "modify", "account", "where", f"name={full}", "set"]
    assert cluster.exec("accounting", [*limited, "GrpJobs=1"]).returncode == 0
    blocker = cluster.ssh(
        ["sbatch", "--parsable", f"--account={full}", "--time=10", "--output=/dev/null", "--wrap=sleep 600"],
        check=True,
    ).stdout.strip()
    try:
        deadline = time.monotonic() + 120
        while cluster.ssh(["squeue", "-h", "-j", blocker, "-o", "%T"]).stdout.strip() != "RUNNING":
            assert time.monotonic() < deadline, "the account's own job never started"
            time.sleep(1)
        yield full, free
    finally:
        cluster.ssh(["scancel", blocker])
        cluster.exec("accounting", [*limited, "GrpJobs=-1"])


def test_a_race_of_two_accounts_keeps_the_free_ones_job_and_cancels_the_one_at_its_limit(
    rehearsals, setup: Setup
):
    """cluv's race of a lab's two accounts on one cluster: `submit --account=FULL,FREE` sends the job
    under both; the free one's starts and is kept, the other, pending at its limit, is cancelled; the
    ledger and `hpcbox jobs` say so."""
    cluster = rehearsals.like("m3")
    env = {"HPCBOX_MINICLUSTER": cluster.name}
    with accounts_one_at_its_limit(cluster) as (full, free):
        raced = invoke(
            setup, "submit", "--cluster=m3", "--via=local", f"--account={full},{free}",
            f"--data={setup.data}", "--flavour=cpu", "--time=10", "--", *SHORT, "--device", "cpu", env=env,
        )  # fmt: skip
        assert raced.returncode == 0, raced.stderr
        kept = raced.stdout.strip().splitlines()[-1]
        ledger = {record.job_id: record for record in jobs.Ledger(setup.project()).on("m3-via-local")}
        lost = next(job_id for job_id, record in ledger.items() if record.race and job_id != kept)
        assert ledger[kept].resources["account"] == free and ledger[lost].resources["account"] == full
        assert (
            ledger[kept].race
            == ledger[lost].race
            == {
                "entrants": [f"m3-via-local job {lost}", f"m3-via-local job {kept}"],
                "kept": f"m3-via-local job {kept}",
                "cancelled": [f"m3-via-local job {lost}"],
            }
        )
        assert f"hpcbox: race: cancelled job {lost} on m3-via-local\n" in raced.stderr, raced.stderr
        assert wait_finished(cluster, lost, timeout_s=60)[0] == "CANCELLED"
        listed = invoke(setup, "jobs", "--cluster=m3-via-local", env=env).stdout.splitlines()
        assert any(f"job {kept}: " in line and "(raced against 1 other: kept, the first to start)" in line
                   for line in listed), listed  # fmt: skip
        assert any(f"job {lost}: CANCELLED" in line and f"(raced: cancelled, m3-via-local job {kept} started "
                   "first)" in line for line in listed), listed  # fmt: skip


def test_an_executor_call_and_an_array_raced_on_two_accounts_return_from_the_free_ones_jobs(
    rehearsals, setup: Setup, tmp_path: Path
):
    """The same race from submitit's surface: `Executor(..., account="FULL,FREE")`; `submit` returns the
    job that started, whose `result()` is the call's return; the other is cancelled. Then `map_array`
    (the path a Hydra multirun takes: an array job per entrant): the free account's array is kept, each
    task returns its call's value, the other array is cancelled."""
    cluster = rehearsals.like("m3")
    script = f"""
import json
from hpcbox.submitit import Executor

executor = Executor({str(tmp_path / "calls")!r}, "m3", via="local")
executor.update_parameters(timeout_min=10, account=sys.argv[1])
job = executor.submit(divmod, 7, 2)
tasks = executor.map_array(divmod, [9, 10], [4, 3])
print(json.dumps([job.job_id, job.result()]))
print(json.dumps([[task.job_id for task in tasks], [task.result() for task in tasks]]))
"""
    with accounts_one_at_its_limit(cluster) as (full, free):
        ran = subprocess.run(
            [sys.executable, "-c", "import sys\n" + script, f"{full},{free}"], cwd=setup.project_dir,
            env={**os.environ, **setup.env, "HPCBOX_MINICLUSTER": cluster.name},
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr[-4000:]
        called, mapped = (json.loads(line) for line in ran.stdout.splitlines()[-2:])
        kept, returned = called
        assert returned == [3, 1]
        task_ids, task_returns = mapped
        assert task_returns == [[2, 1], [3, 1]]
        array = task_ids[0].split("_")[0]
        assert task_ids == [f"{array}_0", f"{array}_1"]
        ledger = {record.job_id: record for record in jobs.Ledger(setup.project()).on("m3-via-local")}
        for kept_id in (kept, array):
            race = ledger[kept_id].race
            assert ledger[kept_id].resources["account"] == free and race is not None
            lost = next(job_id for job_id, each in ledger.items() if each.race == race and job_id != kept_id)
            assert ledger[lost].resources["account"] == full
            assert (race["kept"], race["cancelled"]) == (
                f"m3-via-local job {kept_id}",
                [f"m3-via-local job {lost}"],
            )
            assert wait_finished(cluster, lost, timeout_s=60)[0] == "CANCELLED"


def test_a_call_and_a_training_picked_where_the_site_sends_the_users_signal_checkpoint_at_once_and_resume(
    rehearsals, setup: Setup, tmp_path: Path, tmp_path_factory, monkeypatch
):
    """A site that sets PreemptParameters=send_user_signal, rehearsed from a profile of the user's own
    that says so (`[preemption] send_user_signal = true`; no seed's profile knows it of its site): a
    submitit Checkpointable call and the example trainer in `preemptible` on node1, picked together by a
    `cpu` job that needs node1. Each job's own signal comes as it is picked, not TERM at the grace time's
    end: each checkpoints then, Slurm requeues it, and its next run resumes: the call returns what a run
    never stopped returns, the trainer ends with the figures of the same training never stopped (beside
    it, on node2)."""
    setup, cluster = user_signal_rehearsal(rehearsals, setup, tmp_path, tmp_path_factory, monkeypatch)
    call = PreemptibleCall(setup.project_dir, setup.env, tmp_path / "calls", "usersig", 60, via="local")
    try:
        training = ("--epochs", "20", *TEN_RESTING_STEPS, "--seed", "3", "--workers", "0")
        picked = submit(setup, cluster, training, profile="usersig", job_name="picked",
                        partition="preemptible", extra=("--nodelist=node1",))  # fmt: skip
        whole = submit(setup, cluster, training, profile="usersig", job_name="whole", partition="cpu",
                       extra=("--nodelist=node2",))  # fmt: skip
        assert picked is not None and whole is not None
        call_log = jobs.Ledger(setup.project()).find(call.job_id, "usersig-via-local").log
        until_logged(cluster, call_log, "step 3")
        until_logged(cluster, picked.log, '"epoch": 2,')
        higher = picks_node1(cluster)
        returned = call.result()
    finally:
        call.stop()
    assert returned == {"steps": 60, "starts": 2}, (returned, cluster.ssh(["cat", call_log]).stdout)
    assert wait_finished(cluster, picked.job_id, timeout_s=400) == ("COMPLETED", "0:0"), log_of(
        cluster, picked
    )
    for job_id, log in ((call.job_id, call_log), (picked.job_id, picked.log)):
        runs = runs_in_accounting(cluster, job_id)
        assert runs[0] == "PREEMPTED" and runs[-1] == "COMPLETED", runs
        text = cluster.ssh(["cat", log]).stdout
        assert f"job {job_id} was preempted; the trainer checkpointed" in text, text
    assert finished(cluster, whole).state == "COMPLETED", log_of(cluster, whole)
    resumed_as_never_stopped(cluster, picked, whole)
    started_within_grace(cluster, higher)


def test_a_two_node_training_picked_where_the_site_sends_the_users_signal_checkpoints_at_once_and_resumes(
    rehearsals, setup: Setup, tmp_path: Path, tmp_path_factory, monkeypatch
):
    """test_submit's two-node training (a DDP over both nodes in `preemptible`, on each node one `srun`
    task, that node's torchrun), picked by a `cpu` job that needs node1, where the site sends the user's
    signal: the batch shell hears USR1 as the job is picked, as at its time limit, and passes it to the
    ranks, which checkpoint and exit 75; the script, asking Slurm, knows the job was picked and leaves the
    requeue to Slurm; the next run resumes from that checkpoint and trains to its end, the two ranks with
    the same weights; neither node keeps scratch."""
    setup, cluster = user_signal_rehearsal(rehearsals, setup, tmp_path, tmp_path_factory, monkeypatch)
    higher = picked_two_node_training(setup, cluster, profile="usersig", signal="SIGUSR1")
    started_within_grace(cluster, higher)


def user_signal_rehearsal(
    rehearsals, setup: Setup, tmp_path: Path, tmp_path_factory, monkeypatch
) -> tuple[Setup, minicluster.Cluster]:
    """The rehearsal of a site that sends the user's signal at a preemption (`user_signal_profile`), and
    ``setup`` pointed at it with a ledger of its own (the lane's later commands know no profile
    `usersig`)."""
    own = user_signal_profile(tmp_path / "clusters")
    monkeypatch.setenv("HPCBOX_CLUSTERS_DIR", str(own))
    cluster = rehearsals.like("usersig")
    assert cluster.shape.send_user_signal
    setup = with_own_ledger(setup, tmp_path_factory, "usersig-project")
    env = {**setup.env, "HPCBOX_MINICLUSTER": cluster.name, "HPCBOX_CLUSTERS_DIR": str(own)}
    return Setup(setup.project_dir, setup.data, setup.sif_cache, env), cluster


@contextlib.contextmanager
def full_cluster(run_id: str, state: Path) -> Iterator[minicluster.Cluster]:
    """A mini cluster of its own (profile `local`), each of its nodes held by a job of its own, running."""
    spec = minicluster.ClusterSpec(name=f"{run_id}-full-{uuid.uuid4().hex[:6]}", port=free_port())
    try:
        cluster = minicluster.up(spec, state)
        holders = [
            cluster.ssh(
                ["sbatch", "--parsable", f"--nodelist={node}", "--exclusive", "--output=/dev/null",
                 "--wrap=sleep 600"],
                check=True,
            ).stdout.strip()
            for node in spec.compute_hosts
        ]  # fmt: skip
        # A loaded full run found them not all running after 120 s: the failure now says each one's state.
        deadline = time.monotonic() + 120
        while set(cluster.ssh(["squeue", "-h", "-t", "RUNNING", "-o", "%i"]).stdout.split()) != set(holders):
            queued = cluster.ssh(["squeue", "-h", "-o", "%i %T %r"]).stdout
            assert time.monotonic() < deadline, (
                f"the jobs holding the cluster's nodes never all started: {queued}"
            )
            time.sleep(1)
        yield cluster
    finally:
        minicluster.down(spec.name, state)


def test_a_race_of_two_clusters_keeps_the_idle_ones_job_and_cancels_the_full_ones(
    rehearsals, setup: Setup, run_id: str, minicluster_state: Path
):
    """Two clusters raced from a user's script (`hpcbox.race`), each its own mini cluster, up at once:
    a rehearsal of M3, idle, and a cluster whose every node is held by another job. The idle one's job
    starts and is kept, the other is cancelled there; the ledger and `hpcbox jobs` (which asks each
    mini cluster about its own jobs) say so."""
    idle = rehearsals.like("m3")
    script = f"""
import json, sys
import hpcbox

full = hpcbox.Site("local", mini_cluster=sys.argv[1])
idle = hpcbox.Site("m3", via="local", mini_cluster=sys.argv[2])
args = {[*SHORT, "--device", "cpu"]!r}
raced = hpcbox.race([full, idle], args, data={str(setup.data)!r}, flavour="cpu", offline=True, time="10")
others = [[job.site.where, job.job_id] for job in raced.others]
print(json.dumps([raced.kept.site.where, raced.kept.job_id, others]))
"""
    with full_cluster(run_id, minicluster_state) as full:
        ran = subprocess.run(
            [sys.executable, "-c", script, full.name, idle.name], cwd=setup.project_dir,
            env={**os.environ, **setup.env}, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr[-4000:]
        where, kept, others = json.loads(ran.stdout.splitlines()[-1])
        assert where == "m3-via-local" and [where for where, _ in others] == ["local"], ran.stdout
        lost = others[0][1]
        assert wait_finished(full, lost, timeout_s=60)[0] == "CANCELLED"
        assert wait_finished(idle, kept)[0] == "COMPLETED"
        ledger = jobs.Ledger(setup.project())
        kept_record, lost_record = ledger.find(kept, "m3-via-local"), ledger.find(lost, "local")
        assert (kept_record.mini_cluster, lost_record.mini_cluster) == (idle.name, full.name)
        assert kept_record.race == lost_record.race
        assert kept_record.race["kept"] == f"m3-via-local job {kept}"
        assert kept_record.race["cancelled"] == [f"local job {lost}"]
        listed = invoke(setup, "jobs").stdout.splitlines()
        kept_said = f"job {kept}: COMPLETED", "(raced against 1 other: kept, the first to start)"
        lost_said = f"job {lost}: CANCELLED", f"(raced: cancelled, m3-via-local job {kept} started first)"
        assert any(line.split()[1:2] == ["m3-via-local"] and all(part in line for part in kept_said)
                   for line in listed), listed  # fmt: skip
        assert any(line.split()[1:2] == ["local"] and all(part in line for part in lost_said)
                   for line in listed), listed  # fmt: skip


def test_m3s_desktop_partition_takes_only_its_qos(rehearsals):
    cluster = rehearsals.like("m3")
    text = golden_script("m3")
    assert "#SBATCH --qos=desktopq" in text
    assert "qos" in refused(cluster, without(text, "--qos")).lower()


def test_m3_takes_gpus_of_a_partitions_own_type_only(rehearsals):
    """Each of M3's partitions holds its own GPU model on nodes of its own. The profile only assumes a
    GPU type is required (M3's examples name one): a request without one takes the partition's own."""
    cluster = rehearsals.like("m3")
    text = golden_script("m3")
    assert "#SBATCH --gres=gpu:P4:1" in text
    assert "to start at" in slurm.test_only(cluster.ssh_target(), text.replace("gpu:P4:1", "gpu:1"))
    elsewhere = refused(cluster, text.replace("gpu:P4:1", "gpu:V100:1")).lower()
    assert "requested node configuration is not available" in elsewhere


def test_a_draft_that_cannot_be_made_is_one_line_and_writes_nothing(rehearsals, setup: Setup, tmp_path: Path):
    """A login host that never answers (within 15 s), one without Slurm's commands, a partition with no
    nodes: one line each, and no file. Unnamed, a partition with no nodes is left out, and said so."""
    cluster = rehearsals.like("m3")
    env = {"HPCBOX_MINICLUSTER": cluster.name}
    path = tmp_path / "site.toml"

    def refused_draft(*args: str) -> tuple[str, float]:
        started = time.monotonic()
        done = invoke(setup, "profile.draft", "-o", str(path), *args, env=env)
        took = time.monotonic() - started
        assert done.returncode == 1 and done.stdout == "", done.stdout + done.stderr
        # One error line (after the output of the ssh that failed, where one did), and no file.
        errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, done.stderr
        assert not path.exists()
        return errors[0], took

    with dropping_port() as port:
        said, took = refused_draft("--host=127.0.0.1", f"--port={port}")
    assert took < 15 and said.endswith("Connection timed out"), (took, said)
    empty = ["scontrol", "create", "PartitionName=hpcbox-empty", "MaxTime=30"]
    assert cluster.exec("controller", empty).returncode == 0
    try:
        said, _ = refused_draft("--via=local", "--partitions=hpcbox-empty")
        assert "partitions: 'hpcbox-empty' has no nodes" in said
        kept = invoke(setup, "profile.draft", "-o", str(path), "--via=local", env=env)
        assert kept.returncode == 0 and "left out, having no nodes: hpcbox-empty" in kept.stdout, kept.stderr
        assert [p.name for p in profiles.parse_profile_file(path).partitions] == ["m3g", "m3h", "desktop"]
        path.unlink()
    finally:
        cluster.exec("controller", ["scontrol", "delete", "PartitionName=hpcbox-empty"])
    assert cluster.exec("login", ["mv", "/usr/bin/sinfo", "/usr/bin/sinfo.away"]).returncode == 0
    try:
        said, _ = refused_draft("--via=local")
        assert "has no Slurm to draft a profile from: `sinfo --version` failed" in said
    finally:
        cluster.exec("login", ["mv", "/usr/bin/sinfo.away", "/usr/bin/sinfo"])
