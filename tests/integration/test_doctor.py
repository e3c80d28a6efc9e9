"""`hpcbox doctor` against the real mini cluster: every probe answered by its login node over SSH.

The session's cluster is what the `local` profile describes, so every line is ok. A host that never
answers, and a login shell that never starts, are one line each within the command's bound.
test_rehearsal runs it on a rehearsal of each site's profile, and test_container_software on nodes with
another runtime or without FUSE.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import time
from pathlib import Path

import pytest

from tests.fixtures.cluster import frozen
from tests.fixtures.submitting import Setup
from tests.integration.test_submit import dropping_port, invoke

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

# The command's promise (docs/doctor.md): its table within 20 s of its start, whatever the login node does;
# SSH gives up connecting after 10.
DOCTOR_BOUND_S = 20
# The bound is the doctor's own time, as its first line prints it (from its SSH connection to its
# table): what the command does before (starting Python and invoke, finding the mini cluster through a
# Docker engine) took 30 s once on a bare engine while the other lanes built their images.


def doctor(setup: Setup, *flags: str, env: dict[str, str] | None = None) -> tuple[object, float]:
    """The command's outcome and the doctor's own time (its first line's; the whole command's where it
    printed no table)."""
    started = time.monotonic()
    done = invoke(setup, "doctor", *flags, env=env)
    wall = time.monotonic() - started
    own = re.search(r", (\d+\.\d) s$", done.stdout.splitlines()[0]) if done.stdout else None
    return done, float(own.group(1)) if own else wall


def verdicts(output: str) -> dict[str, list[str]]:
    """The table's lines by verdict (ok, differs, fails)."""
    found: dict[str, list[str]] = {}
    for line in output.splitlines()[1:-1]:
        found.setdefault(line.split()[0], []).append(line)
    return found


def test_the_local_cluster_is_what_its_profile_says_line_by_line(setup: Setup, minicluster):
    done, took = doctor(setup, "--cluster=local")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(
        f"hpcbox doctor: local at {minicluster.user}@127.0.0.1:{minicluster.login_port}"
    )
    assert lines[-1] == "a job would run", done.stdout
    found = verdicts(done.stdout)
    assert set(found) == {"ok"}, done.stdout
    topics = [line.split()[1] for line in found["ok"]]
    assert topics == [
        "slurm", "scheduler", "partitions", "partitions", "partitions", "accounts", "runtime", "mounting",
        "sif", "storage", "storage", "quota", "queue",
    ], done.stdout  # fmt: skip
    text = done.stdout
    assert "Slurm 24.11." in text and "squeue and sacct answer (accounting on)" in text
    assert "cpu: no limit, gres gpu:2" in text and "gpu: no limit, gres gpu:2" in text
    assert "preemptible: no limit, gres gpu:2" in text
    assert "yours: research" in text
    # the Apptainer the node image installed, as the login node's dpkg says: its upstream version
    installed = minicluster.ask("login", ["dpkg-query", "-W", "-f=${Version}", "apptainer"]).stdout
    upstream = re.sub(r"^\d+:|-[^-]+$", "", installed.strip())
    assert f"apptainer version {upstream} " in text and "(/usr/bin/apptainer)" in text, (installed, text)
    assert "user namespaces, FUSE and /usr/bin/squashfuse" in text
    assert re.search(
        r"an hour's job in cpu: Slurm guesses it starts at \S+ \(from the queue as it stands, not a", text
    )
    assert "a zstd SIF (the profile's) mounts on the login node; so do gzip, lzo, xz, lz4" in text
    assert took < DOCTOR_BOUND_S, took


def test_the_probe_sifs_are_the_same_bytes_wherever_made_and_the_site_gets_each_once(
    setup: Setup, minicluster, tmp_path
):
    from hpcbox.sif import probe
    from hpcbox.survey.doctor import PROBE_SIFS

    made = [probe.probe_sifs("x86_64", probe.compressions(), cache=tmp_path / c, say=print) for c in "ab"]
    assert [s.path.read_bytes() for s in made[0]] == [s.path.read_bytes() for s in made[1]]
    assert all(s.path.stat().st_size < 64 * 1024 for s in made[0])  # kilobytes: the SIF's header, mostly

    def stored() -> dict[str, str]:
        """name -> inode of each probe SIF the login node keeps: an upload is a new file."""
        listing = minicluster.ssh(f"stat -c '%n %i' {PROBE_SIFS}/*.sif", check=True).stdout
        return dict(line.rsplit(" ", 1) for line in listing.splitlines())

    first, _ = doctor(setup, "--cluster=local")
    assert first.returncode == 0, first.stdout + first.stderr
    before = stored()
    assert {Path(name).name for name in before} == {s.name for s in made[0]}
    again, _ = doctor(setup, "--cluster=local")
    assert again.returncode == 0 and "making the probe SIFs" not in again.stderr, again.stderr
    assert stored() == before


def test_a_host_that_never_answers_is_one_line_within_the_bound(setup: Setup, minicluster):
    with contextlib.ExitStack() as stack:
        port = stack.enter_context(dropping_port())
        done, took = doctor(setup, "--cluster=edi", "--host=127.0.0.1", f"--port={port}")
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 1 and len(errors) == 1, done.stderr
    assert "127.0.0.1" in errors[0] and done.stdout == "", done.stdout
    assert took < DOCTOR_BOUND_S, took


def test_the_bound_holds_with_accounting_paused_and_a_login_shell_that_takes_2_s(setup: Setup, minicluster):
    """slurmdbd frozen (sacct and sacctmgr wait on it) and a login profile that sleeps 2 s: the doctor
    still answers within its bound, naming the probes that did not answer by the deadline."""
    slow_login = "/etc/profile.d/zz-hpcbox-test-slow.sh"
    minicluster.exec("login", ["sh", "-c", f"echo 'sleep 2' > {slow_login}"])
    try:
        with frozen(minicluster.node_container("accounting")):
            done, took = doctor(setup, "--cluster=local")
    finally:
        minicluster.exec("login", ["rm", "-f", slow_login])
    assert took < DOCTOR_BOUND_S, (took, done.stdout, done.stderr)
    lines = done.stdout.splitlines()
    scheduler = next(line for line in lines if line.split()[1:2] == ["scheduler"])
    assert "no answer by the probes' deadline" in scheduler, done.stdout
    accounts = next(line for line in lines if line.split()[1:2] == ["accounts"])
    assert "no answer by the probes' deadline" in accounts, done.stdout
    # What does not need accounting answered as ever.
    assert any(line.startswith("ok") and " runtime " in line for line in lines), done.stdout
    assert "a zstd SIF (the profile's) mounts on the login node" in done.stdout


def test_a_profile_that_differs_from_the_site_gets_the_key_to_change(setup: Setup, minicluster, tmp_path):
    """The user's own `local` profile (it shadows the shipped one) with a time limit the cluster does not
    have, a GPU model it lacks and a partition it does not have: a line each, naming the key to change;
    the missing partition would fail a job."""
    from hpcbox.render import profiles

    shipped = profiles.load_profile("local").source.read_text()
    mine = shipped.replace('max_time = "INFINITE"', 'max_time = "1:00:00"', 1)
    mine = mine.replace(
        'gpu_types = []\nunknown = ["cpus_per_gpu"]\nnotes = "No CPU-per-GPU limit is configured."\n',
        'gpu_types = ["a100"]\nunknown = ["cpus_per_gpu"]\n',
        2,
    )
    facts = '["max_time", "gpus_per_node", "gpu_types", "cpus_per_gpu"]'
    mine += f'\n[[partitions]]\nname = "bigmem"\nunknown = {facts}\n'
    own = tmp_path / "clusters"
    own.mkdir()
    (own / "local.toml").write_text(mine)
    done, _ = doctor(setup, "--cluster=local", env={"HPCBOX_CLUSTERS_DIR": str(own)})
    assert done.returncode == 1, done.stdout + done.stderr
    found = verdicts(done.stdout)
    assert [" ".join(line.split()) for line in found["differs"]] == [
        "differs partitions cpu: time limit none; no a100 GPUs (gres gpu:2) -> "
        'partitions[0].max_time = "UNLIMITED", partitions[0].gpu_types',
        "differs partitions gpu: no a100 GPUs (gres gpu:2) -> partitions[1].gpu_types",
    ], done.stdout
    assert [" ".join(line.split()) for line in found["fails"]] == [
        "fails partitions bigmem: not a partition here (sinfo has cpu, gpu, preemptible) -> "
        "partitions[3].name"
    ], done.stdout
    assert done.stdout.splitlines()[-1] == "1 check would fail a job; 2 lines where the profile differs"


def test_a_login_shell_whose_start_hangs_is_one_line_within_the_bound(setup: Setup, minicluster):
    """A login profile that never returns (as a ~/.bash_profile waiting on a file system that hangs): the
    doctor's table comes within its bound, one line naming the login shell, exit 1; and `timeout` on the
    login node has ended the hung shell by then. The profile is a file of this test's own on the login
    node, there for this test alone; every shell it holds is killed after, however the test ends."""
    token = secrets.token_hex(4)
    name, started = f"zz-hpcbox-test-hang-{token}.sh", f"/tmp/hpcbox-test-hang-{token}.pids"
    # The shell and its sleep, by id: what this test started and must leave no trace of.
    hang = f'sleep 600 & echo "$$ $!" >> {started}; wait $!\n'.encode()
    minicluster.put_files("login", "/etc/profile.d", {name: (hang, 0o644)})

    def holding() -> list[str]:
        listed = minicluster.ask("login", ["sh", "-c", f"cat {started} 2>/dev/null || true"]).stdout.split()
        return [pid for pid in listed if minicluster.exec("login", ["kill", "-0", pid]).returncode == 0]

    try:
        done, took = doctor(setup, "--cluster=local")
        still = holding()
    finally:
        minicluster.exec("login", ["rm", "-f", f"/etc/profile.d/{name}"])
        leftover = holding()
        if leftover:
            minicluster.exec("login", ["kill", "-KILL", *leftover])
        minicluster.exec("login", ["rm", "-f", started])
    assert took < DOCTOR_BOUND_S, (took, done.stdout, done.stderr)
    assert done.returncode == 1, done.stdout + done.stderr
    header, *found, verdict = done.stdout.splitlines()
    assert header.startswith("hpcbox doctor: local at "), done.stdout
    assert len(found) == 1, done.stdout
    assert re.fullmatch(
        r"fails +login +no answer by the doctor's deadline: the login shell did not start in \d+ s -> "
        r"check ~/\.bash_profile, ~/\.bashrc and /etc/profile\.d/ on the login node: "
        r"a login shell waits there",
        found[0],
    ), done.stdout
    assert verdict == "the site was not checked: no login shell answered by the doctor's deadline"
    assert still == [], f"the hung login shells {still} outlived the doctor"
