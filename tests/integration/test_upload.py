"""The cluster's store over SSH to the mini cluster's login node: a changed environment goes up as a
delta (real rsync against a basis on the cluster), uploads of one file at once go up once (a real
flock there), a basis that cannot be trusted or read still gives the right file (sha256sum there),
and `hpcbox prune` lists and removes what no kept job needs, and never what a job Slurm still holds
needs, whichever checkout queued it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tarfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hpcbox import jobs, store
from hpcbox.build.lock import candidate_versions
from hpcbox.errors import HpcboxError
from hpcbox.files import file_sha256
from hpcbox.store import ship
from hpcbox.tools import ssh
from tests.fixtures.debian import pinned_base
from tests.fixtures.submitting import RESTING, Setup, until_logged
from tests.integration.test_submit import finished, invoke, log_of, submit

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]

# One Debian package more in the cpu environment: what a user's "add one dependency" looks like, pinned
# at the version the mirror serves today (as `invoke lock` would pin it), so that the test knows no date.
ADDED_PACKAGE = "python3-tqdm"
# Runs while the test goes on, resting between steps.
LONG = RESTING
SHORT = ("--epochs", "1", "--steps-per-epoch", "10", "--workers", "0")


@dataclasses.dataclass(frozen=True)
class DeltaJobs:
    running: jobs.JobRecord  # the environment as it was, still running
    added: jobs.JobRecord  # the environment with one package more, sent as a delta


@pytest.fixture(scope="module")
def delta_jobs(setup: Setup, minicluster):
    """A long job in the session's environment, then a short one after one package was added to it and
    the trainer made to import that package; the long one is cancelled at the end."""
    # Its limit well past the module's length (the second build alone can take minutes on a busy
    # machine): at 10 minutes it could be requeued at its limit, no longer RUNNING, mid-module.
    running = submit(setup, minicluster, LONG, time="60")
    assert running is not None
    held_still(minicluster, running)
    lock = setup.project_dir / "docker" / "lock" / "apt-cpu.txt"
    main = setup.project_dir / "src" / "hpctrain" / "__main__.py"
    lock_text, main_text = lock.read_text(), main.read_text()
    lock.write_text(lock_text + f"{ADDED_PACKAGE}={served_today(ADDED_PACKAGE)}\n")
    main.write_text(
        "import sys, tqdm\nprint('imported tqdm', tqdm.__version__, file=sys.stderr)\n" + main_text
    )
    try:
        added = submit(setup, minicluster, SHORT)
    finally:
        lock.write_text(lock_text)
        main.write_text(main_text)
    assert running is not None and added is not None
    yield DeltaJobs(running, added)
    minicluster.ssh(["scancel", running.job_id])


def held_still(minicluster, job: jobs.JobRecord) -> None:
    """Once ``job``'s trainer runs, every process of it stopped (SIGSTOP, sent by Slurm's scancel): Slurm
    still holds the job (STOPPED), without it taking a CPU from the tests beside this module for the
    module's minutes; `let_go` has it run on. Not before its trainer's first line: Apptainer stopped while
    it starts finds, once it runs on, that the deadline of its FUSE mount passed meanwhile ("FATAL:
    context deadline exceeded", the job FAILED: seen in a full run)."""
    job_id = job.job_id
    _wait_for_state(minicluster, job_id, "RUNNING", ("PENDING", "CONFIGURING"))
    until_logged(minicluster, job.log, '"event"')
    minicluster.ssh(["scancel", "--signal=STOP", "--full", job_id], check=True)
    # SIGNALING: Slurm's state while the signal is on its way to the job's processes (seen in a full run).
    _wait_for_state(minicluster, job_id, "STOPPED", ("RUNNING", "SIGNALING"))


def let_go(minicluster, job_id: str) -> None:
    """The job that ``held_still`` stopped, running again (SIGCONT through scancel)."""
    minicluster.ssh(["scancel", "--signal=CONT", "--full", job_id], check=True)
    _wait_for_state(minicluster, job_id, "RUNNING", ("STOPPED",))


def _wait_for_state(minicluster, job_id: str, wanted: str, passing: tuple[str, ...]) -> None:
    """Until squeue says ``wanted``; a squeue that fails (a controller slow to answer under a full run's
    load) is asked again, and any other state fails with what accounting knows of the job."""
    deadline = time.monotonic() + 300
    while True:
        queued = minicluster.ssh(["squeue", "--noheader", "--states=all", "--jobs", job_id, "--format=%T"])
        state = queued.stdout.strip()
        if queued.returncode == 0 and state == wanted:
            return
        accounted = "" if queued.returncode != 0 or state in passing else _accounted(minicluster, job_id)
        assert not accounted and time.monotonic() < deadline, (
            f"job {job_id}: {state or queued.stderr.strip()!r}, not {wanted}; sacct: {accounted}"
        )
        time.sleep(1)


def _accounted(minicluster, job_id: str) -> str:
    fields = "JobID,State,ExitCode,Elapsed,NodeList,Reason"
    done = minicluster.ssh(["sacct", "--noheader", "--parsable2", "-j", job_id, f"--format={fields}"])
    return done.stdout.strip() or done.stderr.strip() or "nothing"


def served_today(package: str) -> str:
    """The version of ``package`` Debian's mirror serves for the pinned base today."""
    return candidate_versions(pinned_base(), (package,))[package]


def upstream(debian_version: str) -> str:
    """1:4.67.1-5+b1 -> 4.67.1: the version the package's own Python module reports."""
    return debian_version.split(":", 1)[-1].rsplit("-", 1)[0]


def remote_sha256(minicluster, path: str) -> str:
    return minicluster.ssh(["sha256sum", path], check=True).stdout.split()[0]


def test_one_added_package_sends_under_one_percent_of_the_sif_and_the_job_imports_it(
    delta_jobs: DeltaJobs, minicluster
):
    before, after = delta_jobs.running, delta_jobs.added
    assert after.sif_sha256 != before.sif_sha256
    assert after.sent == ("sif", "code")
    size = int(minicluster.ssh(["stat", "-c", "%s", after.sif], check=True).stdout)
    # rsync's own count of what went over the wire, the code snapshot's bytes included
    assert after.bytes_sent < size / 100, (after.bytes_sent, size)
    assert remote_sha256(minicluster, after.sif) == after.sif_sha256
    assert remote_sha256(minicluster, before.sif) == before.sif_sha256  # the basis, untouched
    final = finished(minicluster, after)
    log = log_of(minicluster, after)
    assert final.state == "COMPLETED", log
    installed = minicluster.ssh(
        ["apptainer", "exec", after.sif, "dpkg-query", "-W", "-f", "${Version}", ADDED_PACKAGE], check=True
    ).stdout.strip()
    assert f"imported tqdm {upstream(installed)}" in log, (installed, log)
    index = minicluster.ssh(f"cat {after.sif.rsplit('/', 2)[0]}/index/*", check=True).stdout
    uses = [store.StoredUse.from_line(line) for line in index.splitlines()]
    mine = [use for use in uses if use and use.name == after.sif.rsplit("/", 1)[1]]
    assert [(use.project, use.flavour, use.compression) for use in mine] == [("trainer", "cpu", "zstd:3")]


@dataclasses.dataclass(frozen=True)
class Files:
    """Files of random bytes on this side, each a variant of the one before (as environments are)."""

    directory: Path

    def make(self, name: str, data: bytes) -> ship._Upload:
        path = self.directory / name
        path.write_bytes(data)
        sha256 = file_sha256(path)
        use = store.StoredUse("sif", f"{sha256}.sif", "delta-test", "cpu", "zstd:3")
        return ship._Upload(path, f"{self.folder}/{sha256}.sif", sha256, len(data), use)

    @property
    def folder(self) -> str:
        return f"hpcbox-delta-{self.directory.name}"


def upload(minicluster, item: ship._Upload, basis: str | None, said: list[str] | None = None) -> int:
    with ssh.Connection(minicluster.ssh_target()) as connection:
        return ship._upload_stored(
            connection, item, basis, 1 << 40, (said if said is not None else []).append
        )


def variant(data: bytes, at: int) -> bytes:
    """``data`` with 64 KiB of new bytes inserted at ``at``: every later block moves."""
    return data[:at] + os.urandom(64 << 10) + data[at:]


@pytest.fixture
def files(minicluster, tmp_path: Path):
    made = Files(tmp_path / uuid.uuid4().hex[:8])
    made.directory.mkdir()
    yield made
    minicluster.ssh(["rm", "-rf", made.folder])


def test_a_tampered_or_unreadable_basis_still_gives_the_right_file(files: Files, minicluster):
    first = files.make("first", os.urandom(16 << 20))
    assert upload(minicluster, first, None) > 16 << 20
    second = files.make("second", variant(first.local.read_bytes(), 5 << 20))
    basis = first.remote.rsplit("/", 1)[1]
    assert upload(minicluster, second, basis) < 1 << 20  # 64 KiB new: well under 1 MB of 16
    assert remote_sha256(minicluster, second.remote) == second.sha256
    assert remote_sha256(minicluster, first.remote) == first.sha256  # linked, never written into

    # 4 MiB of the basis overwritten after its upload: rsync's own check finds those blocks missing
    # and sends them whole; the sha256 on the cluster is the new file's.
    minicluster.ssh(f"head -c 4194304 /dev/zero | dd of={first.remote} bs=1M seek=8 conv=notrunc status=none")
    third = files.make("third", variant(first.local.read_bytes(), 9 << 20))
    sent = upload(minicluster, third, basis)
    assert 4 << 20 < sent < 6 << 20
    assert remote_sha256(minicluster, third.remote) == third.sha256

    # A basis the user may neither link nor read (another user's, in a group's store): sent whole.
    login = minicluster.node_container("login")
    assert (
        login.exec_run(
            ["sh", "-c", f"chown root: ~researcher/{second.remote} && chmod 0600 ~researcher/{second.remote}"]
        ).exit_code
        == 0
    )
    fourth = files.make("fourth", variant(second.local.read_bytes(), 1 << 20))
    said: list[str] = []
    assert upload(minicluster, fourth, second.remote.rsplit("/", 1)[1], said) > 16 << 20
    assert any("cannot be read on the cluster; sending the whole sif" in line for line in said), said
    assert remote_sha256(minicluster, fourth.remote) == fourth.sha256

    # The local file changed after its sha256 was taken: the delta's result does not check out, the
    # whole file follows, and when that does not either, nothing is left in place.
    fifth = files.make("fifth", variant(first.local.read_bytes(), 2 << 20))
    fifth.local.write_bytes(os.urandom(1 << 20) + fifth.local.read_bytes()[1 << 20 :])
    said = []
    with pytest.raises(HpcboxError, match="arrived with a different sha256"):
        upload(minicluster, fifth, basis, said)
    assert any("did not check out; sending it whole" in line for line in said), said
    left = minicluster.ssh(["ls", "-A", files.folder], check=True).stdout.split()
    assert not [name for name in left if name.startswith((fifth.sha256, f".{fifth.sha256}.sif.partial"))]


def test_two_uploads_at_once_each_succeed_and_one_new_file_goes_up_once(files: Files, minicluster):
    base = files.make("base", os.urandom(8 << 20))
    upload(minicluster, base, None)
    basis = base.remote.rsplit("/", 1)[1]
    for round_number in range(3):
        # Two new files from one basis at once, each under its own temporary name.
        a = files.make(f"a{round_number}", variant(base.local.read_bytes(), 1 << 20))
        b = files.make(f"b{round_number}", variant(base.local.read_bytes(), 6 << 20))
        with ThreadPoolExecutor(2) as pool:
            sent = list(pool.map(lambda item: upload(minicluster, item, basis), [a, b]))
        assert all(0 < count < 1 << 20 for count in sent), sent
        assert [remote_sha256(minicluster, item.remote) for item in (a, b)] == [a.sha256, b.sha256]
        # One new file needed by two at once: one uploads it, the other finds it in place after.
        c = files.make(f"c{round_number}", variant(base.local.read_bytes(), 3 << 20))
        said: list[str] = []
        with ThreadPoolExecutor(2) as pool:
            sent = list(pool.map(lambda item: upload(minicluster, item, basis, said), [c, c]))  # noqa: B023
        assert sorted(count == 0 for count in sent) == [False, True], sent
        assert any("another submit uploaded it" in line for line in said), said
        assert remote_sha256(minicluster, c.remote) == c.sha256
    left = minicluster.ssh(["ls", "-A", files.folder], check=True).stdout.split()
    assert not [name for name in left if name.endswith(".partial") or ".copy." in name]


def test_an_interrupted_upload_sends_only_what_did_not_arrive(files: Files, minicluster):
    """An upload cut off mid-file keeps what arrived (rsync --partial), and the next upload of the file
    sends only the rest; the file is right. Cut off here by the limit on a file's size of the login's
    session it goes through (8 MiB, RLIMIT_FSIZE, which the rsync started there inherits): its write
    past 8 MiB fails, whatever the speed. (Stopping the receiver once 8 MiB had arrived, watched every
    10 ms, missed a 96 MiB upload that took 0.2 s in a full run.)"""
    big = files.make("big", os.urandom(96 << 20))
    name = big.remote.rsplit("/", 1)[1]
    with ssh.Connection(minicluster.ssh_target()) as connection:
        # The shell's parent is the login's sshd session that runs every command of this connection (and
        # of the next ones, through the same master): its soft limit alone, put back after.
        connection.run('prlimit --pid "$PPID" --fsize=8388608:', what="limit the session's file size")
        try:
            with pytest.raises(HpcboxError):
                ship._upload_stored(connection, big, None, 1 << 40, lambda _line: None)
        finally:
            connection.run('prlimit --pid "$PPID" --fsize=unlimited:', what="lift the session's limit")
    partial = f"{files.folder}/.{name}.partial"
    deadline = time.monotonic() + 60
    while minicluster.ssh(f"ls -A {files.folder} | grep -q '[.]partial[.]'").returncode == 0:
        assert time.monotonic() < deadline, "rsync's receiver did not end once its write failed"
        time.sleep(0.2)
    arrived = int(minicluster.ssh(["stat", "-c", "%s", partial], check=True).stdout)
    assert 8 << 20 <= arrived < big.size

    said: list[str] = []
    sent = upload(minicluster, big, None, said)
    assert "hpcbox: an earlier upload of this sif was cut off; sending only what did not arrive" in said, said
    assert sent < big.size - arrived + (1 << 20), (sent, arrived)
    assert remote_sha256(minicluster, big.remote) == big.sha256
    left = minicluster.ssh(["ls", "-A", files.folder], check=True).stdout.split()
    assert not [entry for entry in left if ".partial" in entry], left


# One upload in a process of its own: argv is the login's port, key, known hosts, the local file, its
# place on the cluster, its sha256 and size; it prints the bytes sent, then what it said.
UPLOAD_PROCESS = """
import sys
from pathlib import Path
from hpcbox import store
from hpcbox.store import ship
from hpcbox.tools import ssh
port, key, known, local, remote, sha256, size = sys.argv[1:]
target = ssh.Target("127.0.0.1", int(port), "researcher", Path(key), Path(known))
use = store.StoredUse("sif", remote.rsplit("/", 1)[1], "delta-test", "cpu", "zstd:3")
item = ship._Upload(Path(local), remote, sha256, int(size), use)
said = []
with ssh.Connection(target) as connection:
    sent = ship._upload_stored(connection, item, None, 1 << 40, said.append)
print(sent, *said, sep="\\n")
"""


def test_two_processes_making_the_first_upload_of_one_file_send_it_once(files: Files, minicluster):
    """Two submits (processes, each with its own SSH connection) need one new file the cluster lacks,
    both started while the store's lock on it is held (here, by the test): both wait and say so; then
    one sends it whole, and the other finds it in place."""
    new = files.make("new", os.urandom(24 << 20))
    target = minicluster.ssh_target()
    argv = [
        sys.executable, "-c", UPLOAD_PROCESS, str(target.port), str(target.key_path), str(target.known_hosts),
        str(new.local), new.remote, new.sha256, str(new.size),
    ]  # fmt: skip
    folder, name = new.remote.rsplit("/", 1)
    login = minicluster.node_container("login").attrs["State"]["Pid"]
    both_wait = (
        "for _ in $(seq 6000); do\n"
        "    if [ \"$(pgrep -c -f '^flock 9$')\" -ge 2 ]; then exit 0; fi; sleep 0.01\n"
        "done; exit 1"
    )
    with ssh.Connection(target) as connection, connection.lock(f"{folder}/.{name}.lock"):
        started = [
            subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in (1, 2)
        ]
        waiting = subprocess.run(
            ["nsenter", f"--target={login}", "--mount", "--pid", "--", "sh", "-c", both_wait]
        )
    outputs = [process.communicate(timeout=300) for process in started]
    assert waiting.returncode == 0, ("the two uploads did not both wait on the lock", outputs)
    assert [process.returncode for process in started] == [0, 0], outputs
    sent, said = zip(*((int(out.split("\n", 1)[0]), out.splitlines()[1:]) for out, _ in outputs), strict=True)
    assert sorted(sent)[0] == 0 and sorted(sent)[1] > new.size, outputs
    waited = "hpcbox: another submit is uploading this sif; waiting for it"
    assert all(lines[0] == waited for lines in said), said
    assert "hpcbox: the cluster has the sif now (another submit uploaded it)" in said[sent.index(0)], said
    assert remote_sha256(minicluster, new.remote) == new.sha256
    left = minicluster.ssh(["ls", "-A", files.folder], check=True).stdout.split()
    assert not [entry for entry in left if ".partial" in entry], left


def test_a_grown_dataset_directory_goes_up_as_a_delta(setup: Setup, minicluster, tmp_path: Path):
    directory = tmp_path / "grown"
    with tarfile.open(setup.data) as archive:
        archive.extractall(directory, filter="data")
    (directory / "extra.bin").write_bytes(os.urandom(8 << 20))
    first = submit(setup, minicluster, data=directory)
    (directory / "more.txt").write_text("one file more, in the middle of the archive\n")
    second = submit(setup, minicluster, data=directory)
    assert first is not None and second is not None
    minicluster.ssh(["scancel", first.job_id, second.job_id])
    # Gone from Slurm before the next test: prune keeps what any job Slurm still holds names.
    for record in (first, second):
        finished(minicluster, record)
    assert second.sent == ("dataset",) and second.dataset_sha256 != first.dataset_sha256
    stored = f"{store.folder(second.submit_dir.rsplit('/', 1)[0], 'dataset')}/{second.dataset_sha256}.tar"
    size = int(minicluster.ssh(["stat", "-c", "%s", stored], check=True).stdout)
    assert size > 8 << 20 and second.bytes_sent < size / 20, (second.bytes_sent, size)
    assert remote_sha256(minicluster, stored) == second.dataset_sha256


def _stored_file(minicluster, root: str, project: str, used_at: float) -> str:
    """A file in the store with an index entry of ``project`` (none for ""): its path."""
    name = f"{uuid.uuid4().hex}{uuid.uuid4().hex}.sif"
    path = f"{store.folder(root, 'sif')}/{name}"
    minicluster.ssh(f"head -c 100000 /dev/urandom > {path}", check=True)
    if project:
        use = store.StoredUse("sif", name, project, "cpu", "zstd:3", used_at)
        minicluster.ssh(store.record_script(root, [use]), check=True)
    return path


def test_prune_lists_what_no_kept_job_uses_and_removes_exactly_that_with_yes(
    delta_jobs: DeltaJobs,
    setup: Setup,
    minicluster,
):
    let_go(minicluster, delta_jobs.running.job_id)  # pruned beside a job that runs
    root = delta_jobs.added.submit_dir.rsplit("/", 1)[0]
    old_one = _stored_file(minicluster, root, "trainer", 1.0)  # this project's, used long ago by no job
    others = _stored_file(minicluster, root, "another-project", 1.0)
    nobodys = _stored_file(minicluster, root, "", 1.0)

    def listing() -> list[str]:
        """What prune may remove: the store's files and index entries, the projects' code snapshots (not
        the submit folders, where a job an earlier test queued may start and write meanwhile)."""
        submit_folders = " -o ".join(f"-path '*/{name}/*'" for name in ("scripts", "logs", "runs"))
        find = f"find {root} -mindepth 3 -maxdepth 3 ! -name '.*' ! \\( {submit_folders} \\)"
        found = minicluster.ssh(find, check=True)
        return sorted(found.stdout.split())

    before = listing()
    dry = invoke(setup, "prune", "--cluster", "local", "--keep", "1")
    assert dry.returncode == 0, dry.stderr
    assert listing() == before  # the dry run changes nothing
    listed = [line.split()[-1] for line in dry.stdout.splitlines() if line.startswith("  ")]
    assert old_one in listed
    assert others not in listed and nobodys not in listed
    last = jobs.Ledger(setup.project()).all()[-1]
    kept = {delta_jobs.running.sif, last.sif}  # the running job's, and the last job's (the next basis)
    assert not kept & set(listed)
    assert "jobs of this checkout's ledger kept (the last 1, and any still queued or running)" in dry.stdout
    assert "run again with --yes" in dry.stderr

    done = invoke(setup, "prune", "--cluster", "local", "--keep", "1", "--yes")
    assert done.returncode == 0, done.stderr
    after = listing()
    gone = set(before) - set(after)
    assert set(listed) <= gone
    # and this project's index entries of the files removed, nothing else
    entries = {path.rsplit("/", 1)[1] for path in gone - set(listed)}
    assert entries == {f"{path.rsplit('/', 1)[1]}@trainer" for path in listed if "/code/" not in path} & (
        entries
    )
    assert f"{old_one.rsplit('/', 1)[1]}@trainer" in entries
    assert kept <= set(after) and {others, nobodys} <= set(after)
    assert jobs.Ledger(setup.project()).find(delta_jobs.running.job_id)  # still in the ledger
    state = minicluster.ssh(["squeue", "-h", "-j", delta_jobs.running.job_id, "-o", "%T"], check=True)
    log = minicluster.ssh(["tail", "-n", "30", delta_jobs.running.log]).stdout
    assert state.stdout.strip() == "RUNNING", (_accounted(minicluster, delta_jobs.running.job_id), log)
    again = invoke(setup, "prune", "--cluster", "local", "--keep", "1")
    assert "nothing to prune" in again.stdout


def _second_checkout(setup: Setup, tmp_path: Path) -> Setup:
    """Another checkout of the session's project (a laptop's and a workstation's, two worktrees): the
    same project and files, and a ledger of its own, empty."""
    copy = tmp_path / "second-checkout"
    shutil.copytree(setup.project_dir, copy, ignore=shutil.ignore_patterns(".hpcbox", "runs", "__pycache__"))
    return dataclasses.replace(setup, project_dir=copy)


def _exists(minicluster, *paths: str) -> bool:
    return minicluster.ssh(" && ".join(f"test -e {path}" for path in paths)).returncode == 0


def test_prune_from_a_second_checkout_keeps_what_a_job_queued_from_the_first_needs(
    setup: Setup, minicluster, run_id: str, tmp_path: Path
):
    # A code snapshot of its own, so that no other job of the session uses it.
    marker = setup.project_dir / "src" / "hpctrain" / f"_prune_{uuid.uuid4().hex[:8]}.py"
    marker.write_text(f"# {run_id}: a code snapshot only this test's job uses\n")
    try:
        queued = submit(setup, minicluster, extra=("--begin=now+3600",))
    finally:
        marker.unlink()
    assert queued is not None
    plain_dir = f"{run_id}-plain-{uuid.uuid4().hex[:8]}"
    plain = ""
    try:
        root = queued.submit_dir.rsplit("/", 1)[0]
        needs = (
            queued.sif,
            f"{queued.submit_dir}/code/{queued.code_snapshot[:16]}",
            f"{store.folder(root, 'dataset')}/{queued.dataset_sha256}.tar",
        )
        assert _exists(minicluster, *needs)
        second = _second_checkout(setup, tmp_path)
        done = invoke(second, "prune", "--cluster", "local", "--yes")
        assert done.returncode == 0, done.stderr
        held = next(line for line in done.stdout.splitlines() if "jobs Slurm still holds for you" in line)
        assert queued.job_id in held.rsplit(": ", 1)[1].split(", "), done.stdout
        assert "0 jobs of this checkout's ledger kept" in done.stdout
        assert "cannot tell" not in done.stdout and needs[1] not in done.stdout
        assert _exists(minicluster, *needs), done.stdout

        minicluster.ssh(["scontrol", "update", f"JobId={queued.job_id}", "StartTime=now"], check=True)
        final = finished(minicluster, queued)
        assert (final.state, final.exit_code) == ("COMPLETED", "0:0"), log_of(minicluster, queued)

        # Once the job is over, nothing holds its code snapshot: the second checkout would remove it.
        after = invoke(second, "prune", "--cluster", "local")
        assert after.returncode == 0, after.stderr
        assert needs[1] in after.stdout, after.stdout

        # A job of the same user that hpcbox did not write could use any file: nothing is removed.
        plain = minicluster.ssh(
            f"mkdir -p {plain_dir} && cd {plain_dir} && printf '#!/bin/sh\\nsleep 600\\n' > job.sh && "
            f"sbatch --parsable --hold --job-name={run_id}-plain job.sh",
            check=True,
        ).stdout.strip()
        assert plain.isdigit(), plain
        kept = invoke(second, "prune", "--cluster", "local", "--yes")
        assert kept.returncode == 0, kept.stderr
        assert f"{plain} (its script is not one hpcbox rendered)" in kept.stdout, kept.stdout
        assert "nothing to prune: Slurm holds jobs of yours whose files hpcbox cannot tell" in kept.stdout
        assert not [line for line in kept.stdout.splitlines() if line.startswith("  ")]
        assert _exists(minicluster, *needs)
    finally:
        minicluster.ssh(["scancel", queued.job_id, *([plain] if plain.isdigit() else [])])
        minicluster.ssh(["rm", "-rf", plain_dir])
