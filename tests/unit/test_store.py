"""The store's index and the choice of a delta's basis (store.py), and prune's plan for people."""

from __future__ import annotations

import grp
import gzip
import hashlib
import io
import os
import shlex
import stat
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from hpcbox import store
from hpcbox.errors import FieldError, HpcboxError
from hpcbox.store import prune, ship
from hpcbox.tools import proc


def use(
    name: str, project: str = "trainer", flavour: str = "cpu", compression: str = "zstd:3", at: float = 1.0
):
    return store.StoredUse("sif", name, project, flavour, compression, at)


def listing(*uses: store.StoredUse, files: tuple[str, ...] = ()) -> store.Store:
    names = {u.name for u in uses} | set(files)
    lines = [f"stored\tsif\t100\t{name}" for name in sorted(names)]
    lines += [f"index\t{u.to_line()}" for u in uses]
    return store.parse_listing(lines)


def test_an_index_entry_reads_back_and_anything_else_is_ignored():
    entry = use("a.sif", at=1795618928.5)
    assert store.StoredUse.from_line(entry.to_line()) == entry
    for damaged in ("", "{", "[1, 2]", '{"kind": "sif"}', "not json"):
        assert store.StoredUse.from_line(damaged) is None
    parsed = store.parse_listing(["stored\tsif\t12\ta.sif", "stored\tsif\tx\tb.sif", "index\t{", "junk"])
    assert parsed.files["sif"] == {"a.sif": 12} and parsed.uses == ()


def test_the_basis_is_the_last_jobs_sif_else_the_newest_of_the_same_flavour_and_compression():
    want = use("new.sif", at=9)
    stored = listing(
        use("old.sif", at=1),
        use("newer.sif", at=5),
        use("gzip.sif", compression="gzip:1", at=8),
        use("cuda.sif", flavour="cuda", at=8),
        use("theirs.sif", project="other", at=8),
    )
    assert store.choose_basis(stored, want, last_used="old.sif") == "old.sif"
    assert store.choose_basis(stored, want, last_used=None) == "newer.sif"
    # the last job's SIF is gone, or of another compression: the index's newest instead
    assert store.choose_basis(stored, want, last_used="pruned.sif") == "newer.sif"
    assert store.choose_basis(stored, want, last_used="gzip.sif") == "newer.sif"
    # a SIF from before the index (no entry): the last job's is still the best guess
    assert store.choose_basis(listing(files=("legacy.sif",)), want, last_used="legacy.sif") == "legacy.sif"
    assert store.choose_basis(listing(use("theirs.sif", project="other")), want, last_used=None) is None
    # an index entry whose file is gone is no basis
    assert (
        store.choose_basis(store.parse_listing([f"index\t{use('gone.sif').to_line()}"]), want, None) is None
    )


def test_index_entries_are_written_whole_under_a_unique_name_and_the_listing_reads_them(tmp_path):
    root = str(tmp_path / "hpcbox")
    entries = [
        use("a.sif", project="my project/x"),
        store.StoredUse("dataset", "d.tar", "trainer", used_at=2),
    ]
    subprocess.run(["sh", "-c", store.record_script(root, entries)], check=True)
    (tmp_path / "hpcbox" / "images" / "sha256").mkdir(parents=True)
    (tmp_path / "hpcbox" / "images" / "sha256" / "a.sif").write_bytes(b"x" * 7)
    (tmp_path / "hpcbox" / "images" / "sha256" / ".b.sif.partial").write_bytes(b"x")
    names = sorted(p.name for p in (tmp_path / "hpcbox").rglob("*") if p.is_file())
    assert names == [".b.sif.partial", "a.sif", "a.sif@my_project_x", "d.tar@trainer"]
    listed = subprocess.run(
        ["sh", "-c", store.listing_script(root)], capture_output=True, text=True, check=True
    )
    parsed = store.parse_listing(listed.stdout.splitlines())
    assert parsed.files == {"sif": {"a.sif": 7}, "dataset": {}}
    assert sorted(parsed.uses, key=lambda u: u.kind) == sorted(entries, key=lambda u: u.kind)


def test_the_listing_of_a_store_whose_index_folders_are_empty_ends_well(tmp_path):
    """What a first submit whose upload failed leaves (folders, no entry): the probe's next commands run
    after the listing in one SSH command, and a failed listing left every later submit stuck."""
    root = tmp_path / "hpcbox"
    for kind in store.FOLDERS:
        Path(store.index_folder(str(root), kind)).mkdir(parents=True)
    listed = subprocess.run(
        ["sh", "-c", store.listing_script(str(root)) + "; echo $?"], capture_output=True, text=True
    )
    assert listed.stdout.splitlines() == ["0"]
    assert store.parse_listing([]).files == {"sif": {}, "dataset": {}}


def test_the_listing_reports_what_uploads_left_hidden_and_tells_each_kind_apart(tmp_path):
    """An interrupted SIF upload's part, rsync's and cp's temporaries beside it, a dataset's part, the
    locks, and a code snapshot's unfinished folder: each with its size and its upload's lock."""
    root = tmp_path / "hpcbox"
    sifs, data = Path(store.folder(str(root), "sif")), Path(store.folder(str(root), "dataset"))
    for folder, files in {
        sifs: {"a.sif": 7, ".a.sif.lock": 0, ".b.sif.partial": 5, ".b.sif.partial.Ab12Cd": 3,
               ".c.sif.copy.4242": 2, ".b.sif.lock": 0, ".hpcbox-filler": 9, ".b.sif.partial.toolong": 1},
        data: {".d.tar.partial": 4},
        Path(store.index_folder(str(root), "sif")): {".a.sif@trainer.123": 1},
        root / "trainer" / "code" / ".incoming-Xy12Zw" / "pkg": {"a.py": 3000},
        root / "trainer" / "code" / "0123456789abcdef": {"a.py": 1},
    }.items():  # fmt: skip
        folder.mkdir(parents=True, exist_ok=True)
        for name, size in files.items():
            (folder / name).write_bytes(b"x" * size)
    listed = subprocess.run(
        ["sh", "-c", store.listing_script(str(root), "trainer") + "; echo $?"],
        capture_output=True,
        text=True,
    )
    *lines, status = listed.stdout.splitlines()
    assert status == "0", listed.stderr
    parsed = store.parse_listing(lines)
    assert parsed.files == {"sif": {"a.sif": 7}, "dataset": {}}
    found = {(item.kind, item.name): (item.size, item.what, item.lock) for item in parsed.leftovers}
    incoming = found.pop(("code", ".incoming-Xy12Zw"))
    assert found == {
        ("sif", ".a.sif.lock"): (0, "lock", ".a.sif.lock"),
        ("sif", ".b.sif.lock"): (0, "lock", ".b.sif.lock"),
        ("sif", ".b.sif.partial"): (5, "partial", ".b.sif.lock"),
        ("sif", ".b.sif.partial.Ab12Cd"): (3, "temporary", ".b.sif.lock"),
        ("sif", ".c.sif.copy.4242"): (2, "copy", ".c.sif.lock"),
        ("dataset", ".d.tar.partial"): (4, "partial", ".d.tar.lock"),
    }
    assert incoming[1:] == ("incoming", None) and incoming[0] >= 3000  # what it takes on the disk
    now = time.time()
    assert all(now - 60 < item.changed <= now + 1 for item in parsed.leftovers)
    # Without a project, only the store's own (the probe of every submit).
    alone = subprocess.run(["sh", "-c", store.listing_script(str(root))], capture_output=True, text=True)
    assert {item.kind for item in store.parse_listing(alone.stdout.splitlines()).leftovers} == {
        "sif",
        "dataset",
    }


def test_a_listing_line_of_no_known_leftover_is_ignored():
    lines = [
        "unfinished\tsif\tx\t1.5\t.b.sif.partial",  # no size
        "unfinished\tsif\t1\t1.5\tb.sif",  # not hidden
        "unfinished\tsif\t1\t1.5\t.b.sif",  # hidden, but not an upload's
        "unfinished\tcode\t1\t1.5\t../.incoming-x",
        "unfinished\tcode\t1\t1.5\t0123456789abcdef",
        "unfinished\tother\t1\t1.5\t.b.sif.partial",
        "unfinished\tsif\t1",
    ]
    assert store.parse_listing(lines).leftovers == ()
    (one,) = store.parse_listing(["unfinished\tdataset\t12\t\t.d.tar.gz.partial"]).leftovers
    assert (one.size, one.changed, one.what, one.lock) == (12, 0.0, "partial", ".d.tar.gz.lock")


def test_prunes_plan_for_people_names_each_file_with_its_size():
    plan = prune.Plan(
        (prune.Removable("sif", "/h/hpcbox/images/sha256/a.sif", 514_129_920),),
        kept_jobs=("3", "4"),
        left_alone=2,
        index_entries=(),
    )
    assert prune.describe(plan, keep=None) == [
        "Slurm holds no job of yours",
        "2 jobs of this checkout's ledger kept (those that ended in the last 30 days, and any still queued "
        "or running)",
        "  sif           514.1 MB  /h/hpcbox/images/sha256/a.sif",
        "2 files in the store belong to other projects, or to none hpcbox knows: left alone",
    ]
    empty = prune.Plan((), kept_jobs=(), left_alone=0, index_entries=())
    assert prune.describe(empty, keep=1)[-1].startswith("nothing to prune")


def test_a_jobs_files_are_found_in_this_store_only_and_only_while_it_has_them():
    stored = store.parse_listing(
        ["stored\tsif\t1\ta.sif", "stored\tdataset\t1\tfeed.tar.gz", "stored\tdataset\t1\tbeef.tar"]
    )
    root = "/home/me/hpcbox"
    assert store.used_by(f"{root}/images/sha256/a.sif", "feed", stored, root) == {
        "sif": "a.sif",
        "dataset": "feed.tar.gz",
    }
    assert store.used_by("/elsewhere/images/sha256/a.sif", "beef", stored, root) == {"dataset": "beef.tar"}
    assert store.used_by(f"{root}/images/sha256/gone.sif", "", stored, root) == {}


# --- who may read the store (Access) ---------------------------------------------------------------


class Here:
    """A `Connection` whose remote side is this machine's sh (what ship's commands run in there)."""

    class target:
        address = "login.example"

    def run(self, command, *, what, check=True, hint="", input_bytes=None) -> proc.Completed:
        text = command if isinstance(command, str) else shlex.join(command)
        return proc.run(["sh", "-c", text], what=what, check=check, input_bytes=input_bytes)


def mode(path: Path) -> str:
    return oct(stat.S_IMODE(path.stat().st_mode))[2:]


def code_snapshot(*files: tuple[str, int]) -> ship.CodeSnapshot:
    """A snapshot of ``files`` (name, mode), as the archive brings them (0644 and 0755, whatever here)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, file_mode in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode = 3, file_mode
            tar.addfile(info, io.BytesIO(b"x=1"))
    return ship.CodeSnapshot("c0de" * 16, gzip.compress(buffer.getvalue()), len(files))


def test_settling_is_one_command_in_a_chain_and_changes_only_the_users_own(tmp_path: Path):
    """Access.settle gathers the user's own paths and changes them in one chmod: inside a chain of
    `&&` steps it is one step (a step before it that fails stops it and what follows), and a missing
    path is left alone."""
    mine = tmp_path / "mine"
    mine.write_text("x")
    mine.chmod(0o644)
    settle = store.Access().settle([str(mine), str(tmp_path / "missing")])
    stopped = Here().run(f"false && {settle} && echo after", what="chain", check=False)
    assert stopped.returncode != 0 and "after" not in stopped.stdout and mode(mine) == "644"
    went = Here().run(f"true && {settle} && echo after", what="chain")
    assert went.stdout.strip() == "after" and mode(mine) == "600"


def test_the_store_is_the_users_alone_by_default_and_a_looser_one_is_tightened(tmp_path: Path):
    root = tmp_path / "hpcbox"
    # A store an earlier hpcbox made under umask 022: readable by every user of a 0755 home.
    (root / "images" / "sha256").mkdir(parents=True, mode=0o755)
    old_sif = root / "images" / "sha256" / "old.sif"
    old_sif.write_bytes(b"sif")
    for path in (root, root / "images", root / "images" / "sha256"):
        path.chmod(0o755)
    old_sif.chmod(0o644)
    access = store.Access()
    Here().run(store.folders_script(str(root), "trainer", access), what="make the folders")
    folders = [p for p in (root, *root.rglob("*")) if p.is_dir()]
    assert {p.relative_to(root).as_posix() for p in folders} >= {
        ".", "images/sha256", "images/index", "data/sha256", "data/index", "trainer/code", "trainer/logs",
    }  # fmt: skip
    assert {mode(p) for p in folders} == {"700"}
    use = store.StoredUse("sif", "old.sif", "trainer")
    Here().run(
        store.record_script(str(root), [use], access) + " && " + access.settle([str(old_sif)]),
        what="record",
    )
    assert mode(root / "images" / "index" / use.entry) == "600"
    assert mode(old_sif) == "600"
    snapshot = code_snapshot(("pkg/a.py", 0o644), ("run.sh", 0o755))
    unpack = ship._code_script(f"{root}/trainer/code/c", len(snapshot.archive), access)
    Here().run(unpack, what="unpack", input_bytes=snapshot.archive)
    code = root / "trainer" / "code" / "c"
    assert (mode(code), mode(code / "pkg"), mode(code / "pkg" / "a.py"), mode(code / "run.sh")) == (
        "700", "700", "600", "700",
    )  # fmt: skip


def test_a_store_shared_with_a_group_is_the_groups_and_readable_by_it_only(tmp_path: Path):
    group = grp.getgrgid(os.getgid()).gr_name
    access = store.Access(group)
    assert (access.umask, access.folder_mode, access.file_mode) == ("027", "2750", "640")
    root = tmp_path / "hpcbox"
    Here().run(store.folders_script(str(root), "trainer", access), what="make the folders")
    folders = [p for p in (root, *root.rglob("*")) if p.is_dir()]
    assert {mode(p) for p in folders} == {"2750"}
    assert {p.stat().st_gid for p in folders} == {os.getgid()}
    use = store.StoredUse("dataset", "d.tar", "trainer")
    Here().run(store.record_script(str(root), [use], access), what="record")
    assert mode(root / "data" / "index" / use.entry) == "640"
    snapshot = code_snapshot(("a.py", 0o644), ("run.sh", 0o755))
    unpack = ship._code_script(f"{root}/trainer/code/c", len(snapshot.archive), access)
    Here().run(unpack, what="unpack", input_bytes=snapshot.archive)
    code = root / "trainer" / "code" / "c"
    assert (mode(code), mode(code / "a.py"), mode(code / "run.sh")) == ("2750", "640", "750")
    code.chmod(0o755)  # an earlier, looser snapshot: tightened where a job uses it, execute bits kept
    (code / "a.py").chmod(0o666)
    Here().run(access.settle([str(code)], recursive=True), what="settle")
    assert (mode(code)[-3:], mode(code / "a.py"), mode(code / "run.sh")) == ("750", "640", "750")


def _small_payload(tmp_path: Path, dataset_sha256: str | None = None) -> ship.Payload:
    """A SIF and a dataset under ship.INLINE_MAX_BYTES, with the code snapshot; ``dataset_sha256``: the
    dataset's sha256 as the payload claims it (default: its own)."""
    sif, data = tmp_path / "env.sif", tmp_path / "d.tar"
    sif.write_bytes(os.urandom(200_000))
    data.write_bytes(os.urandom(300_000))
    claimed = dataset_sha256 or hashlib.sha256(data.read_bytes()).hexdigest()
    return ship.Payload(
        sif, hashlib.sha256(sif.read_bytes()).hexdigest(), sif.stat().st_size,
        code_snapshot(("a.py", 0o644)), ship.Dataset(data, claimed), "cpu", "zstd:3",
    )  # fmt: skip


def test_small_files_go_whole_in_ships_one_command_before_the_code_and_leave_no_temporary(tmp_path: Path):
    """What the cluster lacks under ship.INLINE_MAX_BYTES (a call's pickles, a small dataset) goes in the
    same command as the code archive, read from one stdin to each file's size: each in place with its
    sha256 and the store's access, the code unpacked after them, the index recording them; a second
    ship sends nothing."""
    root = tmp_path / "hpcbox"
    payload = _small_payload(tmp_path)
    said: list[str] = []
    remote = ship.ship(Here(), payload, "trainer", root=str(root), say=said.append)
    assert remote.sent == ("sif", "dataset", "code")
    assert remote.bytes_sent == payload.sif_size + 300_000 + len(payload.code.archive)
    for local, placed in ((payload.sif_path, remote.sif), (payload.dataset.path, remote.dataset)):
        assert Path(placed).read_bytes() == local.read_bytes() and mode(Path(placed)) == "600"
    assert (Path(remote.code_dir) / "a.py").read_text() == "x=1"
    hidden = [p.name for p in root.rglob(".*") if ".partial" in p.name or p.name.startswith(".incoming")]
    assert hidden == []
    listing = Here().run(store.listing_script(str(root)), what="list the store").stdout
    listed = store.parse_listing(listing.splitlines())
    assert listed.users("dataset", Path(remote.dataset).name) == {"trainer"}
    assert any("uploading the dataset (300,000 bytes)" in line for line in said), said
    again = ship.ship(Here(), payload, "trainer", root=str(root), say=said.append)
    assert (again.sent, again.bytes_sent) == ((), 0)
    # With everything there, the probe asks no free space and no listing (no upload needs a basis).
    probe = ship._probe(Here(), ship._Layout(str(root), "trainer", payload), str(root))
    assert all(probe.present.values()) and probe.free_bytes == {} and probe.store.uses == ()


def test_a_then_ends_ships_last_command_reading_its_stdin_after_the_files_and_its_statuses_are_the_callers(
    tmp_path: Path,
):
    """What submit puts at the end of ship's last command (sbatch): it runs once the small files and the
    code are in place, given where they are, and reads its own bytes after theirs; a failure with one of
    its statuses is handed back, any other is one line saying what it was doing."""
    root = tmp_path / "hpcbox"
    payload = _small_payload(tmp_path)
    seen: list[ship.Remote] = []
    out = tmp_path / "then.out"

    def then(remote: ship.Remote) -> ship.Then:
        seen.append(remote)
        script = f"test -d {remote.code_dir} && cat > {out} && echo job-7"
        return ship.Then(script, "submit the job", b"#!/bin/bash\necho the job\n", (9,))

    remote = ship.ship(Here(), payload, "trainer", root=str(root), then=then, say=lambda _line: None)
    assert seen and seen[0].sif == remote.sif and seen[0].then_done is None
    assert out.read_bytes() == b"#!/bin/bash\necho the job\n"
    assert remote.then_done is not None and remote.then_done.stdout.strip() == "job-7"
    assert Path(remote.dataset).read_bytes() == payload.dataset.path.read_bytes()

    handed = ship.ship(
        Here(), payload, "trainer", root=str(root), then=lambda _r: ship.Then("exit 9", "x", b"", (9,))
    )
    assert handed.then_done is not None and handed.then_done.returncode == 9
    with pytest.raises(HpcboxError, match=r"then submit the job: no such thing"):
        ship.ship(
            Here(), payload, "trainer", root=str(root),
            then=lambda _r: ship.Then("echo no such thing >&2; exit 8", "submit the job", b"", (9,)),
        )  # fmt: skip


def test_a_small_file_that_arrives_different_is_removed_and_nothing_after_it_is_done(tmp_path: Path):
    root = tmp_path / "hpcbox"
    payload = _small_payload(tmp_path, dataset_sha256="0" * 64)
    with pytest.raises(HpcboxError) as refused:
        ship.ship(Here(), payload, "trainer", root=str(root), say=lambda _line: None)
    assert "d.tar arrived with a different sha256; removed" in refused.value.message
    data = root / "data" / "sha256"
    assert sorted(p.name for p in data.iterdir() if p.is_file()) == []  # neither in place nor left
    assert not (root / "trainer" / "code").exists() or not any((root / "trainer" / "code").iterdir())


def test_a_store_group_the_user_is_not_in_is_one_line_naming_the_setting(tmp_path: Path):
    layout = ship._Layout(str(tmp_path / "hpcbox"), "trainer", None)  # type: ignore[arg-type]
    with pytest.raises(FieldError) as refused:
        ship._make_folders(Here(), layout, store.Access("hpcbox-no-such-group"))
    assert refused.value.field == "store.group"
    assert "not in group 'hpcbox-no-such-group' on login.example" in refused.value.message
    assert "\n" not in refused.value.message and "nothing was sent" in refused.value.hint
    assert not (tmp_path / "hpcbox").exists()  # refused before anything is made
