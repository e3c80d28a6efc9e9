"""Who may read what a submit puts on the cluster, asked of the mini cluster's login node as another user:
nobody but the user by default, though their home folder is readable by all (0755, as at many sites);
with a profile's `[store] group`, that group's members read it and write nothing, and others read none
of it. The job still runs from its private SIF, dataset and code."""

from __future__ import annotations

import shlex

import pytest

from hpcbox import store
from hpcbox.errors import FieldError
from hpcbox.render import profiles
from hpcbox.store import ship
from hpcbox.tools import ssh
from tests.fixtures.submitting import Setup
from tests.integration.test_submit import SHORT, finished, log_of, session_payload, submit

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

OTHER = "hpcbox-other"  # another user of the login node, in no group of the researcher's
MEMBER = "hpcbox-member"  # another user, in the store's group
GROUP = "hpcbox-share"


@pytest.fixture(scope="module")
def other_users(minicluster):
    """Two more users on the login node (made as root, as a site's directory would have them), one of
    them in GROUP with the researcher; the researcher leaves the group again at the end."""
    made = minicluster.exec(
        "login",
        [
            "sh",
            "-c",
            f"getent group {GROUP} >/dev/null || groupadd {GROUP}; "
            f"id {OTHER} >/dev/null 2>&1 || useradd --no-create-home {OTHER}; "
            f"id {MEMBER} >/dev/null 2>&1 || useradd --no-create-home --groups {GROUP} {MEMBER}",
        ],
    )
    assert made.returncode == 0, made.stderr
    yield
    minicluster.exec("login", ["gpasswd", "--delete", minicluster.user, GROUP])
    ssh.end_idle_masters(minicluster.ssh_target())


def as_user(minicluster, user: str, command: str) -> int:
    """The exit status of ``command`` run by ``user`` on the login node."""
    return minicluster.exec("login", ["sh", "-c", command], user=user).returncode


def modes(minicluster, *paths: str) -> dict[str, str]:
    """Each path's mode (octal, as stat prints it) and group."""
    done = minicluster.ssh(["stat", "-c", "%n %a %G", *paths], check=True)
    return {
        name: f"{mode} {group}" for name, mode, group in (line.split() for line in done.stdout.splitlines())
    }


def store_paths(
    root: str, submit_dir: str, sif: str, code_digest: str, dataset_sha256: str
) -> dict[str, str]:
    """What a submit put on the cluster: its folders, files and index entries."""
    sif_name = sif.rsplit("/", 1)[1]
    dataset_name = f"{dataset_sha256}.tar"
    code = f"{submit_dir}/code/{code_digest[:16]}"
    return {
        "root": root,
        "sif folder": store.folder(root, "sif"),
        "sif": sif,
        "sif index entry": f"{store.index_folder(root, 'sif')}/{sif_name}@trainer",
        "dataset folder": store.folder(root, "dataset"),
        "dataset": f"{store.folder(root, 'dataset')}/{dataset_name}",
        "dataset index entry": f"{store.index_folder(root, 'dataset')}/{dataset_name}@trainer",
        "project folder": submit_dir,
        "code folder": code,
        "code file": f"{code}/hpctrain/__main__.py",
    }


def assert_private(minicluster, paths: dict[str, str]) -> None:
    """Only the user reads any of ``paths``: folders 0700, files 0600; another user reads none."""
    found = modes(minicluster, *paths.values())
    for what, path in paths.items():
        folder = what == "root" or what.endswith("folder")
        test = f"test -x {shlex.quote(path)}" if folder else f"cat {shlex.quote(path)} >/dev/null"
        assert as_user(minicluster, OTHER, test) != 0, f"{OTHER} reads the {what}"
        assert as_user(minicluster, minicluster.user, test) == 0, f"the user cannot read the {what}"
        if what != "job script":  # written under the login's own umask, in the project's 0700 folder
            assert found[path].split()[0] == ("700" if folder else "600"), (what, found[path])


def test_another_user_of_the_login_node_can_read_none_of_what_a_submit_put_there(
    setup: Setup, minicluster, other_users
):
    home = minicluster.ssh(["stat", "-c", "%a", f"/home/{minicluster.user}"], check=True).stdout.strip()
    assert home == "755"  # every user may look into it: what is in it must guard itself
    root = f"/home/{minicluster.user}/hpcbox"
    # A store an earlier hpcbox made under umask 022 is tightened where a submit touches it.
    minicluster.ssh(f"mkdir -p {root}/images/sha256 && chmod 755 {root} {root}/images {root}/images/sha256")
    record = submit(setup, minicluster, SHORT)
    assert record is not None
    paths = store_paths(root, record.submit_dir, record.sif, record.code_snapshot, record.dataset_sha256)
    assert_private(minicluster, {**paths, "job script": record.script})
    # The job runs from them all the same, on a compute node, as the user.
    final = finished(minicluster, record)
    assert final.state == "COMPLETED", log_of(minicluster, record)

    # Everything made readable again, as an earlier hpcbox left it: the next submit, which sends
    # nothing, tightens every folder and file its job uses.
    folders = [path for what, path in paths.items() if what == "root" or what.endswith("folder")]
    files = [path for path in paths.values() if path not in folders]
    minicluster.ssh(f"chmod 755 {shlex.join(folders)} && chmod 644 {shlex.join(files)}", check=True)
    again = submit(setup, minicluster, SHORT)
    assert again is not None and again.sent == ()
    minicluster.ssh(["scancel", again.job_id])
    assert_private(minicluster, paths)


def test_a_store_shared_with_a_group_is_read_by_its_members_only_and_written_by_none(
    setup: Setup, minicluster, other_users
):
    minicluster.exec("login", ["usermod", "--append", "--groups", GROUP, minicluster.user])
    ssh.end_idle_masters(minicluster.ssh_target())  # a login from now on has the new group
    profile = profiles.load_profile("local")
    access = store.Access(GROUP)
    project = setup.project()
    payload, _ = session_payload(setup, profile)
    with ssh.Connection(minicluster.ssh_target()) as connection:
        with pytest.raises(FieldError) as refused:  # a group the user is not in: nothing is sent
            ship.ship(
                connection, payload, project.name, root="hpcbox-unshared", access=store.Access("daemon")
            )
        assert refused.value.field == "store.group" and "not in group 'daemon'" in refused.value.message
        remote = ship.ship(connection, payload, project.name, root="hpcbox-shared", access=access)
    assert minicluster.ssh("test -e hpcbox-unshared").returncode != 0
    root = remote.submit_dir.rsplit("/", 1)[0]
    try:
        paths = store_paths(root, remote.submit_dir, remote.sif, payload.code.digest, payload.dataset.sha256)
        found = modes(minicluster, *paths.values())
        for what, path in paths.items():
            mode, group = found[path].split()
            folder = what == "root" or what.endswith("folder")
            assert (mode, group) == ("2750" if folder else "640", GROUP), (what, found[path])
            test = f"test -x {shlex.quote(path)}" if folder else f"cat {shlex.quote(path)} >/dev/null"
            assert as_user(minicluster, MEMBER, test) == 0, f"{MEMBER}, in {GROUP}, cannot read the {what}"
            assert as_user(minicluster, OTHER, test) != 0, f"{OTHER} reads the {what}"
        assert as_user(minicluster, MEMBER, f"touch {shlex.quote(paths['sif folder'])}/theirs") != 0
        assert as_user(minicluster, MEMBER, f": >> {shlex.quote(paths['sif'])}") != 0
    finally:
        minicluster.ssh(["rm", "-rf", root])
