"""The mini Slurm cluster against its real daemons: slurmctld, slurmd, slurmdbd + MariaDB, munge, sshd,
Apptainer. Jobs go in the way a user's do: over SSH to the login node, then `sbatch`."""

from __future__ import annotations

import re
import shlex
import time

import pytest

from hpcbox.errors import HpcboxError
from hpcbox.units import parse_cpu_time
from tests.fixtures.cluster import free_port

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

SACCT_FIELDS = "JobID,State,ExitCode,NodeList,User,Partition,AllocTRES"


def submit(cluster, script: str, *options: str, wait: bool = True) -> str:
    """`sbatch` ``script`` (a shell snippet) over SSH; with ``wait``, return once the job has ended.

    Not `sbatch --wait`: it sleeps 2, 8, then 32 s between looks (sbatch.c), so a 14 s job took 42 s.
    """
    argv = ["sbatch", "--parsable", *options, "--wrap", script]
    done = cluster.ssh(argv)
    job_id = done.stdout.strip().split(";")[0]
    assert job_id.isdigit(), f"sbatch gave no job id: {done.stdout!r} {done.stderr!r}"
    if wait:
        accounting(cluster, job_id, timeout_s=120)
    return job_id


def accounting(cluster, job_id: str, timeout_s: float = 30) -> dict[str, str]:
    """The job's allocation row from `sacct`, once accounting has recorded its end."""
    deadline = time.monotonic() + timeout_s
    row: dict[str, str] = {}
    while time.monotonic() < deadline:
        out = cluster.ssh(
            ["sacct", "-j", job_id, "-X", "--noheader", "--parsable2", f"--format={SACCT_FIELDS}"]
        )
        lines = [line for line in out.stdout.splitlines() if line.strip()]
        if lines:
            row = dict(zip(SACCT_FIELDS.split(","), lines[-1].split("|"), strict=True))
            if row["State"] not in ("PENDING", "RUNNING", "REQUEUED"):
                return row
        time.sleep(1)
    raise AssertionError(f"job {job_id} not finished in accounting after {timeout_s}s: {row}")


def wait_for_state(cluster, host: str, wanted: str, timeout_s: float) -> None:
    """Until slurmctld gives ``host`` the state ``wanted`` (`idle`, whatever its suffix), or, for a
    suffix alone (`*`), any state with it."""
    from hpcbox.minicluster import node_states

    deadline = time.monotonic() + timeout_s
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = node_states(cluster)
        state = states.get(host, "")
        if state.rstrip("*~#") == wanted or (wanted in "*~#" and state.endswith(wanted)):
            return
        time.sleep(1)
    raise AssertionError(f"{host} not {wanted} after {timeout_s}s: {states}")


def test_up_on_a_cluster_busy_on_every_node_returns_and_its_jobs_run_on(minicluster, minicluster_state):
    """A node busy with the user's jobs is up (issue 58: `up`, and the demo with it, waited for every
    job to end, and failed past 180 s): `up` on the running cluster returns while the jobs run, touches
    none of them, and they complete."""
    from hpcbox import minicluster as mc

    whole = submit(minicluster, "sleep 15", "--nodelist=node1", "--cpus-per-task=3", "--mem=100M", wait=False)
    part = submit(minicluster, "sleep 15", "--nodelist=node2", "--cpus-per-task=1", "--mem=100M", wait=False)
    try:
        states = running(minicluster, whole, part)
        assert mc.node_states(minicluster) == {"node1": "allocated", "node2": "mixed"}, states
        again = mc.up(minicluster.spec, minicluster_state)
        assert again.node_container("node1").id == minicluster.node_container("node1").id
        # Returned while both still run: before, it returned only once they had ended.
        assert squeue_states(minicluster, whole, part) == {whole: "RUNNING", part: "RUNNING"}
        assert [accounting(minicluster, job, timeout_s=90)["State"] for job in (whole, part)] == [
            "COMPLETED", "COMPLETED"
        ]  # fmt: skip
    finally:
        minicluster.ssh(["scancel", whole, part])


def squeue_states(cluster, *job_ids: str) -> dict[str, str]:
    argv = ["squeue", "--noheader", "--states=all", "--format=%i %T", f"--jobs={','.join(job_ids)}"]
    listed = cluster.ssh(argv)
    return dict(line.split() for line in listed.stdout.splitlines() if line.strip())


def running(cluster, *job_ids: str, timeout_s: float = 60) -> dict[str, str]:
    """Until Slurm runs every one of ``job_ids``."""
    deadline = time.monotonic() + timeout_s
    while (states := squeue_states(cluster, *job_ids)) != dict.fromkeys(job_ids, "RUNNING"):
        assert time.monotonic() < deadline, f"not all running after {timeout_s}s: {states}"
        time.sleep(0.5)
    return states


def test_every_node_has_exactly_the_versions_the_node_image_locks_pin(minicluster):
    """What a node runs is what the node image's locks pin (the common one and its Slurm version's), as the
    node's own dpkg says; where Debian moved past a pin and the image was built off-lock, the version its
    label names instead (so this holds on the day Debian moves on too)."""
    from hpcbox.build import offlock
    from hpcbox.minicluster import node_image
    from hpcbox.tools import docker

    image = docker.image(minicluster.image)
    assert image is not None and image.labels[node_image.SLURM_LABEL] == minicluster.spec.slurm
    pins: dict[str, str] = {}
    for lock in node_image.locked(minicluster.spec.slurm).locks.values():
        pins |= offlock.apt_pins(lock.read_text())
    assert {"apptainer", "mariadb-server", "munge", "slurm-wlm", "slurmdbd"} <= set(pins)
    moved = {pin.package: pin.served for pin in offlock.from_labels(image.labels)}
    wanted = {package: moved.get(package, version) for package, version in pins.items()}
    for host in ("controller", "login"):
        listed = minicluster.ask(host, ["dpkg-query", "-W", "-f=${Package}=${Version}\n", *sorted(pins)])
        assert listed.returncode == 0, listed.stderr
        assert dict(line.split("=", 1) for line in listed.stdout.split()) == wanted, host


def test_compute_nodes_idle_in_every_partition(minicluster):
    out = minicluster.ssh(["sinfo", "--noheader", "--Node", "--format=%N %P %T %G"], check=True).stdout
    rows = sorted(tuple(line.split()) for line in out.splitlines())
    assert rows == [
        ("node1", "cpu*", "idle", "gpu:2"),
        ("node1", "gpu", "idle", "gpu:2"),
        ("node1", "preemptible", "idle", "gpu:2"),
        ("node2", "cpu*", "idle", "gpu:2"),
        ("node2", "gpu", "idle", "gpu:2"),
        ("node2", "preemptible", "idle", "gpu:2"),
    ]


def test_batch_job_runs_as_the_user_with_scratch_home_and_accounting(minicluster):
    script = (
        'echo "$(hostname) $(id -u) $(id -un)"; '
        'echo scratch-data > "/disk/scratch/job-$SLURM_JOB_ID"; '
        'echo home-data > "$HOME/job-$SLURM_JOB_ID.txt"'
    )
    job_id = submit(minicluster, script, "--output=job-%j.out")

    row = accounting(minicluster, job_id)
    assert (row["State"], row["ExitCode"], row["User"], row["Partition"]) == (
        "COMPLETED",
        "0:0",
        "researcher",
        "cpu",
    )
    node = row["NodeList"]
    assert node in ("node1", "node2")
    # $HOME is shared: what the job wrote on the compute node is visible on the login node.
    home = minicluster.ssh(f"cat job-{job_id}.out job-{job_id}.txt", check=True).stdout.split()
    assert home == [node, "1500", "researcher", "home-data"]
    # /disk/scratch is node-local: the file is on the job's node and on no other.
    other = "node2" if node == "node1" else "node1"
    path = f"/disk/scratch/job-{job_id}"
    assert minicluster.ask(node, ["cat", path]).stdout == "scratch-data\n"
    assert minicluster.exec(other, ["test", "-e", path]).returncode == 1
    assert minicluster.ask(node, ["stat", "-c", "%u", path]).stdout.strip() == "1500"


def test_each_node_got_its_init_files_as_roots_and_the_user_reads_no_secret_of_them(minicluster):
    modes = {}
    for host in ("accounting", "controller", "node1", "login"):
        listed = minicluster.ask(host, ["find", "/etc/hpcbox-init", "-type", "f", "-printf", "%f %U %m\n"])
        modes[host] = {
            name: (owner, mode) for name, owner, mode in map(str.split, listed.stdout.splitlines())
        }
        assert {owner for owner, _ in modes[host].values()} == {"0"}, modes[host]
        assert modes[host]["munge.key"][1] == "400" and modes[host]["slurm.conf"][1] == "644"
    assert modes["accounting"]["slurmdbd.conf"][1] == "600"
    for host in ("node1", "login"):
        read = minicluster.exec(host, ["cat", "/etc/hpcbox-init/munge.key"], user="researcher")
        assert read.returncode != 0 and "Permission denied" in read.stderr


def test_a_command_in_a_node_gives_its_output_as_written_and_an_answer_cut_short_is_known(minicluster):
    said = minicluster.exec("node1", ["sh", "-c", "printf 'no newline'; printf 'err' >&2; exit 3"])
    assert (said.returncode, said.stdout, said.stderr) == (3, "no newline", "err")
    assert minicluster.ask("controller", ["sinfo", "--version"]).stdout.startswith("slurm")
    # A shell that dies before it has said all (as an output stream Docker ends early looks): asked
    # again, then said in one line; `exec` gives what came.
    cut = ["sh", "-c", "echo partial; kill -KILL $PPID"]
    assert minicluster.exec("node1", cut).stdout == "partial\n"
    with pytest.raises(HpcboxError, match=r"Docker lost the output of `sh -c .*` in its node1 container"):
        minicluster.ask("node1", cut)


def test_failed_job_exit_code_is_recorded(minicluster):
    job_id = submit(minicluster, "exit 3", "--output=/dev/null")
    row = accounting(minicluster, job_id)
    assert (row["State"], row["ExitCode"]) == ("FAILED", "3:0")


@pytest.mark.parametrize("request_gpu", ["--gres=gpu:1", "--gpus=1"])
def test_gpu_job_is_scheduled_on_the_gpu_partition(minicluster, request_gpu):
    job_id = submit(
        minicluster, 'echo "$SLURM_GPUS_ON_NODE"', "--partition=gpu", request_gpu, "--output=gpu-%j.out"
    )
    row = accounting(minicluster, job_id)
    assert (row["State"], row["Partition"]) == ("COMPLETED", "gpu")
    assert "gres/gpu=1" in row["AllocTRES"].split(",")
    assert minicluster.ssh(f"cat gpu-{job_id}.out", check=True).stdout.strip() == "1"


def test_more_gpus_than_any_node_has_is_rejected(minicluster):
    done = minicluster.ssh(["sbatch", "--partition=gpu", "--gres=gpu:3", "--wrap", "true"])
    assert done.returncode != 0
    assert "Requested node configuration is not available" in done.stderr


def test_job_runs_apptainer_exec_of_a_sif_as_the_user(minicluster, run_id):
    # A tiny SIF made on a compute node from a busybox root filesystem, into the shared data area.
    sif = f"/data/researcher/{run_id}-tiny.sif"
    build = (
        "set -e; root=$(mktemp -d); mkdir -p $root/bin $root/etc $root/scratch; "
        "cp /bin/busybox $root/bin/; for t in sh id cat echo; do ln -s busybox $root/bin/$t; done; "
        "grep researcher /etc/passwd > $root/etc/passwd; grep researcher /etc/group > $root/etc/group; "
        f"apptainer --quiet build {shlex.quote(sif)} $root; rm -rf $root"
    )
    built = minicluster.exec("node1", ["bash", "-c", build], user="researcher")
    assert built.returncode == 0, built.stderr

    script = (
        'dir=/disk/scratch/$USER/$SLURM_JOB_ID; mkdir -p "$dir"; '
        f'apptainer --quiet exec --bind "$dir:/scratch" {shlex.quote(sif)} '
        "sh -c 'id -u > /scratch/inside; echo written-in-sif >> /scratch/inside'; "
        'cat "$dir/inside"'
    )
    job_id = submit(minicluster, script, "--output=sif-%j.out")
    row = accounting(minicluster, job_id)
    assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0")
    assert minicluster.ssh(f"cat sif-{job_id}.out", check=True).stdout.split() == ["1500", "written-in-sif"]
    on_node = minicluster.ask(row["NodeList"], ["cat", f"/disk/scratch/researcher/{job_id}/inside"])
    assert on_node.stdout.split() == ["1500", "written-in-sif"]


def test_memory_a_job_held_is_recorded_as_its_max_rss(minicluster):
    # 200 MiB touched and held for 12 s: a dozen samples at JobAcctGatherFrequency=task=1.
    hold = "python3 -c 'import time; block = bytearray(200 * 1024 * 1024); time.sleep(12)'"
    job_id = submit(minicluster, hold, "--output=/dev/null")
    assert accounting(minicluster, job_id)["State"] == "COMPLETED"
    out = minicluster.ssh(
        ["sacct", "-j", f"{job_id}.batch", "--noheader", "--parsable2", "--units=K", "--format=MaxRSS"],
        check=True,
    ).stdout.strip()
    assert out.endswith("K"), f"no MaxRSS for {job_id}.batch: {out!r}"
    max_rss_mib = float(out[:-1]) / 1024
    assert 200 <= max_rss_mib <= 300, out


# 400 MiB touched, 10 MiB at a time, against --mem=200M; then the job script goes on.
GROW = (
    "python3 -c 'import time\nblocks = []\nfor _ in range(40):\n"
    "    blocks.append(bytearray(10 * 1024 * 1024)); time.sleep(0.05)\ntime.sleep(10)'; "
    "echo script-went-on-after=$?"
)
# What a job prints of its own cgroup from inside it, on cgroup v2 or v1: the CPUs and the memory limit
# of its job level (the path /proc/self/cgroup names, up to its job_N), which Slurm set from its request.
OWN_CGROUP = (
    "if [ -f /sys/fs/cgroup/cgroup.controllers ]; then "
    'job=/sys/fs/cgroup$(sed -n "s/^0:://p" /proc/self/cgroup); job=${job%%/step_*}; '
    'echo "cgroup-cpus=$(cat $job/cpuset.cpus.effective) cgroup-memory=$(cat $job/memory.max)"; '
    'else cpus=$(sed -n "s/^[0-9]*:cpuset://p" /proc/self/cgroup); '
    'memory=$(sed -n "s/^[0-9]*:memory://p" /proc/self/cgroup); '
    'echo "cgroup-cpus=$(cat /sys/fs/cgroup/cpuset${cpus%%/step_*}/cpuset.effective_cpus)" '
    '"cgroup-memory=$(cat /sys/fs/cgroup/memory${memory%%/step_*}/memory.limit_in_bytes)"; fi; '
)


def test_a_job_over_its_memory_ends_out_of_memory_by_its_cgroup_or_failed_by_the_accounting(
    minicluster, enforced_by
):
    """Where the engine gives the nodes cgroups: the job's memory cgroup (ConstrainRAMSpace), its limit
    the --mem asked, lets no process past it: the kernel kills the one that passes it, at once, the job
    script goes on (as at a cgroup site), and Slurm ends the job OUT_OF_MEMORY. Where it gives none:
    Slurm's accounting samples the step's RSS every second and kills the whole step past --mem (FAILED
    0:9, the job script with it). Without either this job would complete."""
    if not minicluster.shape.cgroups:
        job_id = submit(minicluster, GROW, "--mem=200M", "--output=mem-%j.out")
        accounting_killed(minicluster, job_id)
        return
    job_id = submit(minicluster, OWN_CGROUP + GROW, "--mem=200M", "--output=mem-%j.out")
    row = accounting(minicluster, job_id)
    log = minicluster.ssh(f"cat mem-{job_id}.out", check=True).stdout
    assert (row["State"], row["ExitCode"]) == ("OUT_OF_MEMORY", "0:125"), (row, log)  # the log: its cgroup
    assert f"cgroup-memory={200 * 1024 * 1024}" in log.split(), log  # the job's own cgroup held it
    assert "script-went-on-after=137" in log, log  # SIGKILL for the process alone
    assert re.search(rf"Detected \d+ oom.kill event.* in StepId={job_id}\.batch", log), log


def accounting_killed(cluster, job_id: str) -> None:
    """Job ``job_id`` (GROW against --mem=200M, its output in mem-<id>.out) as Slurm's accounting ends
    it: the whole batch step killed past --mem, FAILED 0:9, its sampled peak past the request."""
    row = accounting(cluster, job_id)
    assert (row["State"], row["ExitCode"]) == ("FAILED", "0:9")
    log = cluster.ssh(f"cat mem-{job_id}.out", check=True).stdout
    assert "exceeded memory limit" in log and "being killed" in log, log
    assert "script-went-on-after" not in log, log  # the whole batch step went
    peak = cluster.ssh(
        ["sacct", "-j", f"{job_id}.batch", "--noheader", "--parsable2", "--units=K", "--format=MaxRSS"],
        check=True,
    ).stdout.strip()
    assert 200 * 1024 < float(peak.rstrip("K")) < 400 * 1024, peak  # past --mem, stopped before the end


def test_a_spike_freed_at_once_is_stopped_by_a_cgroup_where_sampling_may_miss_it(minicluster, enforced_by):
    # 300 MiB touched and freed at once against --mem=100M: gone before a sample of the accounting
    # (every second) is likely to see it, but not past a cgroup.
    spike = "python3 -c 'block = bytearray(300 * 1024 * 1024); del block'; sleep 3"
    job_id = submit(minicluster, spike, "--mem=100M", "--output=/dev/null")
    row = accounting(minicluster, job_id)
    if minicluster.shape.cgroups:
        assert row["State"] == "OUT_OF_MEMORY", row
    else:  # a sample that happened to land on the spike kills the step; most do not
        assert (row["State"], row["ExitCode"]) in {("COMPLETED", "0:0"), ("FAILED", "0:9")}, row


def test_each_job_runs_on_the_cpus_it_was_given_and_no_more(minicluster, enforced_by):
    # Two busy processes in a one-CPU job: bound to that CPU (task/affinity), together they get one
    # CPU's time, not two; sacct's whole-second Elapsed allows a second either way. Where the nodes have
    # cgroups, the job's own cpuset is that one CPU too: a process cannot bind itself out of it.
    burn = (
        "grep Cpus_allowed_list /proc/self/status; timeout 8 yes >/dev/null & timeout 8 yes >/dev/null & wait"
    )
    own = OWN_CGROUP if minicluster.shape.cgroups else ""
    # Its stdout alone: Slurm 22.05's stepd on cgroup v2 in a container writes errors at its step's end
    # to the job's stderr (docs/minicluster.md).
    output = ("--output=cpus-%j.out", "--error=cpus-%j.err")
    job_id = submit(minicluster, own + burn, "--cpus-per-task=1", *output)
    printed = minicluster.ssh(f"cat cpus-{job_id}.out", check=True).stdout.split()
    allowed = printed[-1]
    assert re.fullmatch(r"\d+", allowed), " ".join(printed)  # one CPU, not a list or a range
    if minicluster.shape.cgroups:
        assert f"cgroup-cpus={allowed}" in printed, printed
    times = minicluster.ssh(
        ["sacct", "-j", job_id, "-X", "--noheader", "--parsable2", "--format=ElapsedRaw,TotalCPU"], check=True
    ).stdout.strip()
    elapsed, cpu = times.split("|")
    assert parse_cpu_time(cpu) <= int(elapsed) + 1, times


# What a job was told of its GPUs, and what it met opening each of the node's GPU device files: the
# fake devices have no driver, so one a job may open says ENXIO ("No such device or address"); one its
# cgroup denies says EPERM ("Operation not permitted").
SHOW_GPUS = (
    'echo "${CUDA_VISIBLE_DEVICES-none} ${SLURM_JOB_GPUS-none} $HPCBOX_PLACEHOLDER_GPUS"; '
    "python3 -c 'import errno, glob, os\n"
    'for path in sorted(glob.glob("/dev/fakegpu*")):\n'
    '    try:\n        os.close(os.open(path, os.O_RDONLY)); met = "opened"\n'
    "    except OSError as exc:\n        met = errno.errorcode[exc.errno]\n"
    '    print(f"{path}={met}")\'; sleep 4'
)


def gpus_seen(cluster, *options: str) -> dict[str, list[str]]:
    """Two one-GPU jobs at once on node1 and a CPU job there: job id -> the words SHOW_GPUS printed (its
    stdout alone, as the CPU test reads)."""
    output = ("--output=vis-%j.out", "--error=vis-%j.err")
    gpu = ("--partition=gpu", "--gres=gpu:1", "--nodelist=node1", *output, *options)
    jobs = [submit(cluster, SHOW_GPUS, *gpu, wait=False) for _ in range(2)]
    jobs.append(submit(cluster, SHOW_GPUS, "--nodelist=node1", *output, wait=False))
    told = {}
    for job_id in jobs:
        assert accounting(cluster, job_id, timeout_s=120)["State"] == "COMPLETED"
        told[job_id] = cluster.ssh(f"cat vis-{job_id}.out", check=True).stdout.split()
    return told


def test_a_gpu_job_sees_only_its_gpus_as_at_a_site_that_constrains_devices(minicluster, enforced_by):
    # Two one-GPU jobs at once on one node get its two GPUs: SLURM_JOB_GPUS names each its own, and, as
    # at a site with ConstrainDevices, each sees its one GPU as CUDA device 0. Each can open its own
    # GPU's device file and not the other's; a CPU job opens none. And their GPUs are placeholders (the
    # node's task prolog): a CUDA build trains on the CPU here. Without cgroups a job is only told its
    # GPUs (test_without_cgroups_...).
    first, second, cpu_only = gpus_seen(minicluster).values()
    if not minicluster.shape.cgroups:
        only_told(first, second, cpu_only)
        return
    assert sorted([first[1], second[1]]) == ["0", "1"], (first, second)
    assert first[0] == second[0] == "0", (first, second)
    for seen in (first, second):
        own = f"/dev/fakegpu{seen[1]}"
        other = f"/dev/fakegpu{1 - int(seen[1])}"
        assert sorted(seen[3:]) == sorted([f"{own}=ENXIO", f"{other}=EPERM"]), " ".join(seen)
    assert cpu_only[:2] == ["none", "none"], cpu_only
    assert cpu_only[3:] == ["/dev/fakegpu0=EPERM", "/dev/fakegpu1=EPERM"], cpu_only
    assert {seen[2] for seen in (first, second, cpu_only)} == {"1"}


def test_without_cgroups_slurms_accounting_kills_a_job_over_its_memory_and_gpus_are_only_told(
    run_id, docker_engine, minicluster_state
):
    """What the mini cluster does on an engine that gives its nodes no cgroups (cgroup v2, rootless):
    Slurm's accounting samples each step's RSS every second and kills the whole step past --mem (FAILED
    0:9, the job script with it); a job is told its GPUs but can open every GPU device file."""
    from hpcbox import minicluster as mc

    spec = mc.ClusterSpec(name=f"{run_id}-mc-nocg", nodes=1, cpus_per_node=3, port=free_port(), cgroups=False)
    try:
        cluster = mc.up(spec, minicluster_state)
        assert not cluster.shape.cgroups
        accounting_killed(cluster, submit(cluster, GROW, "--mem=200M", "--output=mem-%j.out"))
        only_told(*gpus_seen(cluster).values())
    finally:
        mc.down(spec.name, minicluster_state)


def only_told(first: list[str], second: list[str], cpu_only: list[str]) -> None:
    """What gpus_seen gives where no cgroup constrains devices: each GPU job told its own GPU (by its
    index on the node: nothing renumbers it), and every job can open every GPU device file."""
    assert sorted([first[0], second[0]]) == ["0", "1"] and first[0] == first[1], (first, second)
    opened = ["/dev/fakegpu0=opened", "/dev/fakegpu1=opened"]
    assert first[3:] == second[3:] == cpu_only[3:] == opened, (first, second, cpu_only)


def test_up_is_idempotent_and_down_leaves_nothing_behind(run_id, docker_engine, minicluster_state):
    from hpcbox import minicluster as mc

    spec = mc.ClusterSpec(name=f"{run_id}-mc-updown", nodes=1, port=free_port())
    label = {"label": f"io.hpcbox.minicluster={spec.name}"}
    try:
        first = mc.up(spec, minicluster_state)
        ids = {c.name: c.id for c in docker_engine.containers.list(all=True, filters=label)}
        assert sorted(ids) == sorted(
            spec.container(h) for h in ("accounting", "controller", "node1", "login")
        )
        # Made through testcontainers (its labels), with no reaper container pulled or started for it.
        made = docker_engine.containers.list(all=True, filters=label)
        assert {c.labels.get("org.testcontainers") for c in made} == {"true"}
        assert docker_engine.containers.list(all=True, filters={"name": "ryuk"}, ignore_removed=True) == []
        again = mc.up(spec, minicluster_state)
        assert again.ssh("hostname", check=True).stdout.strip() == "login"
        assert {c.name: c.id for c in docker_engine.containers.list(all=True, filters=label)} == ids
        assert first.key_path.stat().st_mode & 0o777 == 0o600
        # A node whose slurmd stops answering (stopped, its container running) is not up: `up` names
        # it and the state slurmctld gives it, with its own log and the controller's lines about it.
        first.exec("node1", ["pkill", "--signal", "STOP", "--exact", "slurmd"])
        wait_for_state(first, "node1", "*", timeout_s=60)
        with pytest.raises(HpcboxError) as refused:
            mc.up(spec, minicluster_state, timeout_s=2)
        assert re.fullmatch(
            rf"cluster {spec.name} did not come up: node1: (IDLE|DOWN)\* \(not responding\), after 2 s",
            refused.value.message,
        ), refused.value.message
        shown = re.findall(r"^--- (.+)$", refused.value.details, re.MULTILINE)
        assert shown == [spec.container("node1"), f"{spec.container('controller')}, its lines about node1"]
        assert "node1" in refused.value.details.split(shown[1])[1]
    finally:
        removed = mc.down(spec.name, minicluster_state)
    assert len(removed.containers) == 4 and len(removed.networks) == 1 and len(removed.volumes) == 2
    assert docker_engine.containers.list(all=True, filters=label) == []
    assert docker_engine.networks.list(filters=label) == []
    assert docker_engine.volumes.list(filters=label) == []
    # ignore_removed: the SDK inspects each container it lists, and other tests' go meanwhile.
    assert docker_engine.containers.list(all=True, filters={"name": spec.name}, ignore_removed=True) == []
    assert not (minicluster_state / spec.name).exists()


def test_every_short_flag_of_hpcbox_is_the_one_sbatch_and_squeue_give_that_option(minicluster):
    """A letter never means something else in hpcbox than in Slurm: each one in SHORT_FLAGS is, in the
    real `sbatch --help` (`squeue --help` for -j), the short form of the option it stands for."""
    from hpcbox.cli.tasks import SHORT_FLAGS

    helps = {
        command: minicluster.ssh([command, "--help"], check=True).stdout for command in ("sbatch", "squeue")
    }
    for name, (letter, long_option) in SHORT_FLAGS.items():
        text = helps["squeue" if name == "job" else "sbatch"]
        assert re.search(rf"(?m)^\s+-{letter}, {long_option}\b", text), (name, letter, long_option)
