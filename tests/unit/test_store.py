"""The store's index and the choice of a delta's basis (store.py), and prune's plan for people."""

from __future__ import annotations

import subprocess

from hpcbox.jobs import prune, store


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


def test_prunes_plan_for_people_names_each_file_with_its_size():
    plan = prune.Plan(
        (prune.Removable("sif", "/h/hpcbox/images/sha256/a.sif", 514_129_920),),
        kept_jobs=("3", "4"),
        left_alone=2,
        index_entries=(),
    )
    assert prune.describe(plan, keep=None) == [
        "2 jobs kept (those that ended in the last 30 days, and any still queued or running)",
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
