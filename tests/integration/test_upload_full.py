"""A file system that fills while rsync writes a SIF into the cluster's store, after the check of the free
space (`df`) passed: what a user or project quota does, which `df` does not see. The upload stops with
one line naming the cause rsync reported, the part that arrived is removed, the store's index, the basis
of a delta and the local ledger are as they were, and no job is queued.

The store's folder is a small tmpfs in the login node's mount namespace, big enough for the check; a
filler there waits until rsync has written into its temporary file, stops rsync, fills the rest and lets
rsync go on. A quota on a
tmpfs needs a kernel built with CONFIG_TMPFS_QUOTA, which these machines' is not (nor has it ext4's or
XFS's quota support), so rsync meets "No space left on device" here: hpcbox takes it and "Disk quota
exceeded" (errno 28 and 122) the same way, from rsync's own words.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcbox import jobs, store
from hpcbox.errors import HpcboxError
from hpcbox.files import file_sha256
from hpcbox.store import ship
from tests.fixtures.submitting import Setup
from tests.integration.test_submit import SHORT, invoke, local_resources, session_payload

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

MIB = 1 << 20
DOCKER = "/usr/bin/docker"
NO_ROOM = ("No space left on device", "Disk quota exceeded")


@dataclasses.dataclass(frozen=True)
class Login:
    """The login node as root on the host sees it: its mount namespace, and the cluster user's store."""

    pid: int
    uid: str
    root: str  # the user's store root, ~/hpcbox

    @property
    def enter(self) -> list[str]:
        return ["nsenter", f"--target={self.pid}", "--mount", "--"]

    @property
    def sif_folder(self) -> str:
        return store.folder(self.root, "sif")


@pytest.fixture(scope="module")
def login(minicluster) -> Login:
    if os.geteuid() != 0:
        pytest.fail("needs root on the host: it mounts a small tmpfs inside the login node", pytrace=False)
    root = f"$HOME/{ship.DEFAULT_REMOTE_ROOT}"
    # The folder the tmpfs goes over, as the first submit would make it.
    uid, home = minicluster.ssh(
        f'umask 077 && mkdir -p "{store.folder(root, "sif")}" && id -u && printf %s "$HOME"', check=True
    ).stdout.split("\n", 1)
    pid = minicluster.node_container("login").attrs["State"]["Pid"]
    return Login(pid, uid, f"{home}/{ship.DEFAULT_REMOTE_ROOT}")


@contextlib.contextmanager
def small_store(login: Login, size: int, folder: str | None = None) -> Iterator[None]:
    """A tmpfs of ``size`` bytes (whole MiB) over the SIF store (or ``folder``), the user's, for the
    block."""
    folder = folder or login.sif_folder
    options = f"size={-(-size // MIB)}m,uid={login.uid},mode=0700"
    name = f"hpcbox-full-{uuid.uuid4().hex[:8]}"
    subprocess.run([*login.enter, "mount", "-t", "tmpfs", "-o", options, name, folder], check=True)
    try:
        yield
    finally:
        if subprocess.run([*login.enter, "umount", folder], check=False).returncode != 0:
            subprocess.run([*login.enter, "umount", "--lazy", folder], check=True)


@contextlib.contextmanager
def filled_while_written(login: Login, filler: str) -> Iterator[subprocess.Popen[str]]:
    """A process in the login node's mount and pid namespaces that waits (up to 2 minutes) until rsync's
    temporary file in the SIF store has bytes in it, then stops the process writing it, writes
    ``filler`` there until the file system is full, lets the writer go on, and says `filled`: rsync
    cannot finish first, however fast it is. Killed at the end of the block if it is still waiting."""
    script = (
        f"cd {shlex.quote(login.sif_folder)} || exit 2; i=0; "
        "while [ $i -lt 12000 ]; do "
        # rsync writes `.NAME.partial` as `.NAME.partial.XXXXXX` beside it and renames it at the end.
        'for f in .*.partial.??????; do if [ -s "$f" ]; then '
        'writers=$(for fd in /proc/[0-9]*/fd/*; do if [ "$(readlink "$fd")" = "$PWD/$f" ]; then '
        'fd=${fd#/proc/}; echo "${fd%%/*}"; fi; done 2>/dev/null | sort -u); '
        'if [ -n "$writers" ]; then kill -STOP $writers; '
        f"cat /dev/zero > {shlex.quote(filler)} 2>/dev/null; kill -CONT $writers; "
        'echo "filled, rsync writing $f"; exit 0; fi; '
        "fi; done; i=$((i + 1)); sleep 0.01; done; echo 'rsync wrote nothing'; exit 1"
    )
    enter = ["nsenter", f"--target={login.pid}", "--mount", "--pid", "--"]  # its /proc: the node's
    process = subprocess.Popen(
        [*enter, "sh", "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@dataclasses.dataclass(frozen=True)
class State:
    """What a failed upload must leave as it was: the local ledger's files, the store's index (each
    entry's bytes and time, hidden temporaries included) and the user's jobs in Slurm's queue."""

    ledger: dict[str, bytes]
    index: str
    queued: frozenset[str]

    @classmethod
    def of(cls, setup: Setup, minicluster, login: Login) -> State:
        directory = jobs.Ledger(setup.project()).directory
        ledger = {
            str(path.relative_to(directory)): path.read_bytes()
            for path in sorted(directory.rglob("*"))
            if path.is_file()
        }
        folders = " ".join(shlex.quote(store.index_folder(login.root, kind)) for kind in store.FOLDERS)
        index, _, queue = minicluster.ssh(
            f"find {folders} -type f -printf '%p %s %T@\\n' 2>/dev/null | sort; "
            f"find {folders} -type f -exec sha256sum {{}} + 2>/dev/null | sort; "
            f"echo queue; squeue -h -u {shlex.quote(minicluster.user)} -o %i",
            check=True,
        ).stdout.rpartition("queue\n")
        return cls(ledger, index, frozenset(queue.split()))


def assert_no_room(caught: pytest.ExceptionInfo[HpcboxError], login: Login, filler) -> None:
    """The error is one line naming the store's folder and rsync's cause, from the upload itself: the
    check of the free space before it passed, and the filler filled the file system while rsync wrote."""
    message = caught.value.message
    assert "\n" not in message, message
    assert message.startswith("the cluster has no room for ") and f" in {login.sif_folder}: " in message
    assert message.endswith(NO_ROOM), (message, caught.value.details)
    assert filler.wait(timeout=60) == 0
    assert filler.stdout.read().startswith("filled, rsync writing .")


def assert_unchanged(before: State, after: State) -> None:
    assert after.ledger == before.ledger
    assert after.index == before.index
    assert after.queued <= before.queued, sorted(after.queued - before.queued)


def in_login(login: Login, *argv: str) -> str:
    """What ``argv`` prints, run as root in the login node's mount namespace (no SSH: quicker)."""
    return subprocess.run([*login.enter, *argv], check=True, capture_output=True, text=True).stdout


def stored(login: Login, folder: str | None = None) -> list[str]:
    """Every name in the store's SIF folder (or ``folder``), hidden ones included."""
    return sorted(in_login(login, "ls", "-A", folder or login.sif_folder).split())


@dataclasses.dataclass(frozen=True)
class Job:
    """The session's job as test_submit submits it, its payload made once for the module."""

    setup: Setup
    minicluster: object
    profile: object
    resources: object
    payload: ship.Payload
    image: str

    def submit(
        self,
        sif=None,
        *,
        said: list[str] | None = None,
        dry_run: bool = False,
        remote_root: str = ship.DEFAULT_REMOTE_ROOT,
    ):
        """Submit it, with the SIF ``sif`` (its path, sha256 and size) where given, to the store under
        ``remote_root``."""
        payload = self.payload
        if sif is not None:
            payload = dataclasses.replace(
                payload, sif_path=sif.path, sif_sha256=sif.sha256, sif_size=sif.size
            )
        return jobs.submit(
            self.setup.project(),
            self.profile,
            self.minicluster.ssh_target(),
            self.resources,
            SHORT,
            payload,
            image=self.image,
            remote_root=remote_root,
            dry_run=dry_run,
            say=(said if said is not None else []).append,
        )


@pytest.fixture(scope="module")
def job(setup: Setup, minicluster) -> Job:
    profile, resources = local_resources()
    payload, environment = session_payload(setup, profile)
    return Job(setup, minicluster, profile, resources, payload, environment.ref)


def test_a_disk_filled_while_the_whole_sif_goes_up_leaves_nothing_of_it(
    job: Job, setup: Setup, minicluster, login: Login, trainer_sif
):
    filler = f".hpcbox-filler-{uuid.uuid4().hex[:8]}"
    underneath = stored(login)
    before = State.of(setup, minicluster, login)
    # Room for the SIF and 1 MiB more: the check before the upload passes.
    with small_store(login, trainer_sif.size + MIB):
        assert stored(login) == []  # no basis on the cluster: the SIF goes whole
        with filled_while_written(login, filler) as filling:
            with pytest.raises(HpcboxError) as caught:
                job.submit()
            assert_no_room(caught, login, filling)
        left = stored(login)
        after = State.of(setup, minicluster, login)
        # Room again: the next submit looks at the store as before (the failed one made the store's
        # folders, and wrote no index entry in them) and would send the SIF.
        subprocess.run([*login.enter, "rm", f"{login.sif_folder}/{filler}"], check=True)
        said: list[str] = []
        job.submit(said=said, dry_run=True)
    # Neither the SIF nor the part of it that arrived: only the filler, and the upload's (empty) lock.
    assert left == sorted([filler, f".{trainer_sif.sha256}.sif.lock"])
    assert_unchanged(before, after)
    assert stored(login) == underneath  # the real store, untouched underneath
    assert any(line.startswith("hpcbox: would upload the sif ") for line in said), said


@dataclasses.dataclass(frozen=True)
class ChangedSif:
    path: Path
    sha256: str
    size: int


@pytest.fixture(scope="module")
def changed_sif(trainer_sif, apptainer_helper, run_id, tmp_path_factory) -> ChangedSif:
    """The session's SIF with one small data object more (as `apptainer sif add` makes it): a new SIF
    whose blocks are nearly all the old one's, the smallest change that makes a delta upload."""
    folder = tmp_path_factory.mktemp("changed-sif")
    shutil.copyfile(trainer_sif.path, folder / "changed.sif")
    (folder / "note.json").write_text('{"hpcbox-test": "one object more than the session\'s SIF"}\n')
    name = f"{run_id}-sif-add-{uuid.uuid4().hex[:8]}"
    add = ["apptainer", "sif", "add", "--datatype", "6", "/work/changed.sif", "/work/note.json"]
    run = [DOCKER, "run", "--rm", "--name", name, "--network", "none", "-v", f"{folder}:/work"]
    subprocess.run([*run, apptainer_helper, *add], check=True, capture_output=True)
    path = folder / "changed.sif"
    sha256 = file_sha256(path)
    assert sha256 != trainer_sif.sha256
    return ChangedSif(path, sha256, path.stat().st_size)


def put_basis(minicluster, login: Login, sif, use: store.StoredUse) -> str:
    """``sif`` in the (small) store as a submit leaves it, the user's and private, with its index entry
    unless it has one: the earlier SIF of the project, which the next upload takes as its basis."""
    path = f"{login.sif_folder}/{use.name}"
    owner = shlex.quote(f"{minicluster.user}:")  # and the user's own group
    with sif.path.open("rb") as source:
        subprocess.run(
            [*login.enter, "sh", "-c", f'umask 077 && cat > "$0" && chown {owner} "$0"', path],
            stdin=source,
            check=True,
        )
    entry = f"{store.index_folder(login.root, 'sif')}/{use.entry}"
    minicluster.ssh(
        f"test -f {shlex.quote(entry)} || {{ {store.record_script(login.root, [use])}; }}", check=True
    )
    return path


def test_a_disk_filled_while_a_delta_goes_up_leaves_its_basis_and_the_index_as_they_were(
    job: Job, setup: Setup, minicluster, login: Login, trainer_sif, changed_sif: ChangedSif
):
    filler = f".hpcbox-filler-{uuid.uuid4().hex[:8]}"
    assert job.payload.sif_sha256 == trainer_sif.sha256
    earlier = store.StoredUse(
        "sif",
        f"{trainer_sif.sha256}.sif",
        setup.project().name,
        job.payload.flavour,
        job.payload.compression,
        used_at=1.0,
    )
    # Room for the basis, the new SIF and 2 MiB more: the check before the upload passes.
    with small_store(login, trainer_sif.size + changed_sif.size + 2 * MIB):
        basis = put_basis(minicluster, login, trainer_sif, earlier)
        before = State.of(setup, minicluster, login)
        said: list[str] = []
        with filled_while_written(login, filler) as filling:
            with pytest.raises(HpcboxError) as caught:
                job.submit(changed_sif, said=said)
            assert_no_room(caught, login, filling)
        left = stored(login)
        basis_now = in_login(login, "sha256sum", basis).split()[0]
        links = in_login(login, "stat", "-c", "%h", basis).strip()
    after = State.of(setup, minicluster, login)
    assert any(f"only what {trainer_sif.sha256[:12]} lacks" in line for line in said), said  # a delta
    # Neither the new SIF nor the part of it that arrived, nor a link to the basis under its name.
    assert left == sorted([filler, earlier.name, f".{changed_sif.sha256}.sif.lock"])
    assert (basis_now, links) == (trainer_sif.sha256, "1")  # the basis, untouched
    assert_unchanged(before, after)


@contextlib.contextmanager
def lock_held(login: Login, lock: str) -> Iterator[None]:
    """``lock`` held by `flock` on the login node for the block, as a running upload holds its lock."""
    holder = subprocess.Popen(
        [*login.enter, "flock", lock, "sh", "-c", "echo locked; exec sleep 600"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        yield
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()


def test_prune_removes_what_an_interrupted_upload_left_and_keeps_a_part_whose_upload_runs(
    job: Job, setup: Setup, minicluster, login: Login, trainer_sif
):
    """An interrupted upload of the session's SIF left its part (rsync --partial) and rsync's temporary
    in a store with room for the SIF only without them: the next submit stops at the check of the free
    space, and `prune --yes` removes both, which frees the room. The part of another upload, whose lock
    a `flock` on the login node holds, is kept and named, and goes once the lock is free. The lock files
    stay."""
    # A store of its own: prune --yes sees, and may remove, nothing the session's other tests use.
    root = f"{ship.DEFAULT_REMOTE_ROOT}-prune-{uuid.uuid4().hex[:8]}"
    absolute = f"{login.root.rsplit('/', 1)[0]}/{root}"
    sifs = store.folder(absolute, "sif")
    names = {
        "part": f".{trainer_sif.sha256}.sif.partial",
        "temporary": f".{trainer_sif.sha256}.sif.partial.Ab12Cd",
        "lock": f".{trainer_sif.sha256}.sif.lock",
        "running": f".{'0' * 64}.sif.partial",
        "running lock": f".{'0' * 64}.sif.lock",
    }
    path = {key: f"{sifs}/{name}" for key, name in names.items()}
    minicluster.ssh(f"umask 077 && mkdir -p {shlex.quote(sifs)}", check=True)
    try:
        with small_store(login, trainer_sif.size + 2 * MIB, sifs):
            # As the user, what the uploads left: half the SIF and what rsync wrote after it, the other
            # upload's 1 MiB, and both locks.
            minicluster.ssh(
                f"umask 077 && head -c {trainer_sif.size // 2} /dev/zero > {path['part']} && "
                f"head -c {MIB} /dev/zero > {path['temporary']} && : >> {path['lock']} && "
                f"head -c {MIB} /dev/zero > {path['running']} && : >> {path['running lock']}",
                check=True,
            )
            with pytest.raises(HpcboxError) as caught:
                job.submit(remote_root=root)
            assert caught.value.message.startswith("the cluster has no room for ") and (
                caught.value.message.endswith(" MB free")
            ), caught.value.message
            assert "lists the files no recent job uses, and what unfinished uploads left" in caught.value.hint

            prune = ("prune", "--cluster", "local", "--remote-root", root)
            with lock_held(login, path["running lock"]):
                dry = invoke(setup, *prune)
                assert dry.returncode == 0, dry.stderr
                assert stored(login, sifs) == sorted(names.values())  # the dry run changes nothing
                done = invoke(setup, *prune, "--yes")
                assert done.returncode == 0, done.stderr
                left = stored(login, sifs)
            for said in (dry.stdout, done.stdout):
                listed = [line.split() for line in said.splitlines() if line.startswith("  ")]
                assert sorted((words[0], words[-1]) for words in listed) == [
                    ("sif", path["part"]),
                    ("sif", path["temporary"]),
                ], said
                assert all(
                    " MB  unfinished upload: " in line for line in said.splitlines() if line[:2] == "  "
                )
                assert (
                    "unfinished upload kept, an upload of it is running now (it holds its lock): "
                    f"{path['running']} (1.0 MB)"
                ) in said.splitlines(), said
            size = (trainer_sif.size // 2 + MIB) / 1e6
            assert f"run again with --yes to delete these 2 files, {size:,.1f} MB" in dry.stderr
            assert f"deleted 2 files, {size:,.1f} MB" in done.stderr
            assert left == sorted([names["lock"], names["running"], names["running lock"]])
            free = int(in_login(login, "df", "-Pk", sifs).splitlines()[1].split()[3]) * 1024
            assert free >= trainer_sif.size  # the check that stopped the submit would pass now

            # The other upload is over (or its submit was killed): its part goes too, its lock stays.
            after = invoke(setup, *prune, "--yes")
            assert after.returncode == 0, after.stderr
            assert f"  sif             1.0 MB  unfinished upload: {path['running']}" in after.stdout
            assert stored(login, sifs) == sorted([names["lock"], names["running lock"]])
    finally:
        minicluster.ssh(["rm", "-rf", "--", absolute])
