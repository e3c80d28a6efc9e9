"""What `hpcbox prune` keeps for the jobs Slurm still holds (prune.py, slurm.held_jobs_script): the
inputs a job script hpcbox rendered names, read back from the script itself; and the whole plan, from the
real look-around shell run here against a store in a temporary home and stand-ins for squeue and
scontrol, for a second checkout whose ledger knows none of the held jobs."""

from __future__ import annotations

import contextlib
import fcntl
import posixpath
import shlex
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcbox import store
from hpcbox.errors import HpcboxError
from hpcbox.project.command import ContainerCommand, Step, Steps
from hpcbox.render import profiles
from hpcbox.render.resources import ResourceRequest, resolve
from hpcbox.render.sbatch import JobInputs, render_sbatch
from hpcbox.render.sweep import Sweep
from hpcbox.store import prune
from hpcbox.tools import proc, slurm

SIF_SHA = "a" * 64
OLD_SHA = "b" * 64
DATA_SHA = "d" * 64


def rendered(root: str, code: str = "0123456789abcdef", **request) -> str:
    """A job script as `submit` renders it: the store's absolute paths under ``root``."""
    profile = profiles.load_profile("local")
    inputs = JobInputs(
        sif=f"{root}/images/sha256/{SIF_SHA}.sif",
        code_dir=f"{root}/trainer/code/{code}",
        dataset=f"{root}/data/sha256/{DATA_SHA}.tar",
        runs_dir="runs",
        log_dir="logs",
        sif_sha256=SIF_SHA,
        code_revision="0" * 40,
    )
    checked = resolve(profile, ResourceRequest(**{"job_name": "j", "time": "10", **request}))
    return render_sbatch(profile, checked, inputs, ("--epochs", "1")).text


@pytest.mark.parametrize(
    "request_",
    [{}, {"sif_on_scratch": True}, {"nodes": 2, "gpus": 1}, {"unpack_sif": True}],
    ids=["plain", "sif-on-scratch", "two-nodes", "unpacked"],
)
def test_a_rendered_script_gives_back_the_sif_code_and_dataset_it_was_rendered_with(request_):
    root = "/home/s1234/hpcbox"
    paths, why = prune.script_inputs(rendered(root, **request_))
    assert why == ""
    assert paths == (
        f"{root}/images/sha256/{SIF_SHA}.sif",
        f"{root}/trainer/code/0123456789abcdef",
        f"{root}/data/sha256/{DATA_SHA}.tar",
    )


def test_paths_that_need_quoting_and_array_and_step_scripts_read_back_too():
    root = "/home/o'neil/my hpcbox"
    assert prune.script_inputs(rendered(root))[0][0] == f"{root}/images/sha256/{SIF_SHA}.sif"
    profile = profiles.load_profile("local")
    inputs = JobInputs(f"{root}/s.sif", f"{root}/trainer/code/c", f"{root}/d.tar", "runs", "logs")
    sweep = Sweep("sweep.toml", (("--lr", "0.1"), ("--lr", "0.2")))
    checked = resolve(profile, ResourceRequest(job_name="j", time="10", array=sweep.array()))
    array = render_sbatch(profile, checked, inputs, (), sweep=sweep).text
    steps = Steps((Step("a", ContainerCommand("module", "a")), Step("b", ContainerCommand("module", "b"))))
    stepped = render_sbatch(profile, resolve(profile, ResourceRequest(job_name="j")), inputs, (), steps).text
    for text in (array, stepped):
        assert prune.script_inputs(text) == ((f"{root}/s.sif", f"{root}/trainer/code/c", f"{root}/d.tar"), "")


def test_a_script_hpcbox_did_not_render_or_cannot_place_says_why():
    assert prune.script_inputs("#!/bin/bash\nsleep 600\n") == ((), "its script is not one hpcbox rendered")
    profile = profiles.load_profile("local")
    relative = render_sbatch(
        profile, resolve(profile, ResourceRequest(job_name="j")), JobInputs.defaults("trainer"), ()
    ).text
    assert prune.script_inputs(relative) == ((), "its sif is relative to the folder it was submitted from")
    text = rendered("/home/u/hpcbox")
    edited = text.replace("\ncode_dir=/home/u/hpcbox/", '\ncode_dir="$HOME"/hpcbox/', 1)
    assert prune.script_inputs(edited) == ((), "its code_dir line is not in a form this hpcbox reads")
    assert prune.script_inputs(text.replace("\ndataset=", "\n# dataset=", 1))[1].startswith("its dataset")


class LocalConnection:
    """A `Connection` whose remote side is this machine: a temporary home, and stand-ins for squeue and
    scontrol ahead on PATH. Counts the commands (each one a round trip over SSH)."""

    class target:
        address = "login.example"

    def __init__(self, home: Path, bin_dir: Path) -> None:
        self.home, self.bin_dir, self.commands = home, bin_dir, 0

    def run(self, command, *, what, check=True, hint="", input_bytes=None) -> proc.Completed:
        self.commands += 1
        text = command if isinstance(command, str) else shlex.join(command)
        env = {"PATH": f"{self.bin_dir}:/usr/bin:/bin", "HOME": str(self.home), "LC_ALL": "C"}
        return proc.run(["sh", "-c", text], what=what, check=check, env=env, cwd=self.home)


FAKE_SQUEUE = """#!/bin/sh
test -e "$FAKE/squeue-fails" && { echo "squeue: error: Unable to contact slurm controller" >&2; exit 1; }
cat "$FAKE/queue"
"""
# `scontrol write batch_script ID -`: the script kept for job ID, or Slurm's error.
FAKE_SCONTROL = """#!/bin/sh
test "$1 $2 $4" = "write batch_script -" || exit 2
if test -f "$FAKE/scripts/$3"; then cat "$FAKE/scripts/$3"; exit 0; fi
echo "slurm_job_batch_script error: Job has no batch script" >&2
exit 1
"""


@pytest.fixture
def cluster(tmp_path: Path) -> LocalConnection:
    home, bin_dir, fake = tmp_path / "home", tmp_path / "bin", tmp_path / "fake"
    for folder in (home, bin_dir, fake / "scripts"):
        folder.mkdir(parents=True)
    for name, text in (("squeue", FAKE_SQUEUE), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text.replace("$FAKE", shlex.quote(str(fake))))
        (bin_dir / name).chmod(stat.S_IRWXU)
    (fake / "queue").write_text("")
    return LocalConnection(home, bin_dir)


def queue(cluster: LocalConnection, jobs: dict[str, str | None], lines: list[str] | None = None) -> None:
    """Slurm holds ``jobs`` (id -> its batch script, None: no script), as squeue's `%F|%A` lines."""
    fake = cluster.bin_dir.parent / "fake"
    (fake / "queue").write_text("".join(f"{line}\n" for line in lines or [f"{j}|{j}" for j in jobs]))
    for job_id, text in jobs.items():
        if text is not None:
            (fake / "scripts" / job_id).write_text(text)


def test_held_jobs_are_read_in_one_command_one_per_array_with_slurms_word_where_it_has_no_script(cluster):
    script = rendered("/h/hpcbox")
    queue(cluster, {"7": script, "9": None, "12": script}, ["7|7", "9|9", "12|13", "12|14", "12|12"])
    done = cluster.run(slurm.held_jobs_script(), what="ask")
    held = slurm.parse_held_jobs(done.stdout.splitlines())
    assert [job.job_id for job in held] == ["12", "7", "9"]  # the array 12 once, by its own id
    assert held[1] == slurm.HeldJob("7", script.rstrip("\n"))
    assert held[2] == slurm.HeldJob("9", None, "slurm_job_batch_script error: Job has no batch script")
    (cluster.bin_dir.parent / "fake" / "squeue-fails").touch()
    with pytest.raises(HpcboxError, match="Unable to contact slurm controller"):
        cluster.run(slurm.held_jobs_script(), what="ask")


def put(cluster: LocalConnection, relative: str, size: int = 10) -> str:
    path = cluster.home / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if relative.endswith("/"):
        path.mkdir(exist_ok=True)
        (path / "main.py").write_text("x" * size)
    else:
        path.write_bytes(b"x" * size)
    return str(path).rstrip("/")


def a_store_two_checkouts_use(cluster: LocalConnection) -> dict[str, str]:
    """The store the first checkout filled: the SIF, dataset and code snapshot its queued job uses, an
    older SIF and code snapshot no job uses, and a newer SIF (the next delta's basis)."""
    paths = {
        "sif": put(cluster, f"hpcbox/images/sha256/{SIF_SHA}.sif"),
        "old sif": put(cluster, f"hpcbox/images/sha256/{OLD_SHA}.sif"),
        "newest sif": put(cluster, f"hpcbox/images/sha256/{'c' * 64}.sif"),
        "dataset": put(cluster, f"hpcbox/data/sha256/{DATA_SHA}.tar"),
        "code": put(cluster, "hpcbox/trainer/code/0123456789abcdef/"),
        "old code": put(cluster, "hpcbox/trainer/code/fedcba9876543210/"),
    }
    root = str(cluster.home / "hpcbox")
    uses = [
        store.StoredUse("sif", f"{SIF_SHA}.sif", "trainer", "cpu", "zstd:3", 2.0),
        store.StoredUse("sif", f"{OLD_SHA}.sif", "trainer", "cpu", "zstd:3", 1.0),
        store.StoredUse("sif", f"{'c' * 64}.sif", "trainer", "cpu", "zstd:3", 3.0),
        store.StoredUse("dataset", f"{DATA_SHA}.tar", "trainer", used_at=2.0),
    ]
    cluster.run(store.record_script(root, uses), what="index")
    cluster.commands = 0
    return paths


@pytest.mark.parametrize("root", ["hpcbox", "hpcbox/"])
def test_a_second_checkout_keeps_what_a_job_queued_from_the_first_uses(cluster, root: str):
    paths = a_store_two_checkouts_use(cluster)
    queue(cluster, {"41": rendered(str(cluster.home / "hpcbox"))})
    plan = prune.plan(cluster, "trainer", [], root=root, keep=0)  # its own ledger is empty
    assert cluster.commands == 1  # the jobs, their scripts and the store: one round trip
    removed = sorted(posixpath.normpath(item.path) for item in plan.removable)
    assert removed == [paths["old sif"], paths["old code"]]
    assert (plan.held_jobs, plan.unknown_jobs, plan.kept_jobs) == (("41",), (), ())
    assert prune.describe(plan, keep=0)[:2] == [
        "1 jobs Slurm still holds for you (of any project or checkout) keep every file their scripts "
        "name: 41",
        "0 jobs of this checkout's ledger kept (the last 0, and any still queued or running)",
    ]

    # Nothing queued: the job's SIF, dataset and code snapshot go too, but the newest SIF and dataset
    # (the next delta's basis).
    queue(cluster, {})
    bare = prune.plan(cluster, "trainer", [], root="hpcbox", keep=0)
    assert sorted(item.path for item in bare.removable) == sorted(
        [paths["old sif"], paths["old code"], paths["sif"], paths["code"]]
    )
    assert prune.describe(bare, keep=0)[0] == "Slurm holds no job of yours"


def test_a_job_that_reaches_the_store_through_a_link_keeps_its_files(cluster):
    paths = a_store_two_checkouts_use(cluster)
    (cluster.home / "scratch").symlink_to(cluster.home / "hpcbox")
    queue(cluster, {"41": rendered(str(cluster.home / "scratch"))})
    plan = prune.plan(cluster, "trainer", [], root="hpcbox", keep=0)
    assert cluster.commands == 2  # and one more, for readlink
    assert sorted(item.path for item in plan.removable) == [paths["old sif"], paths["old code"]]


def test_a_held_job_whose_files_cannot_be_told_keeps_everything_and_is_named(cluster):
    a_store_two_checkouts_use(cluster)
    queue(cluster, {"41": rendered(str(cluster.home / "hpcbox")), "50": "#!/bin/sh\nsleep 600\n", "51": None})
    plan = prune.plan(cluster, "trainer", [], root="hpcbox", keep=0)
    assert plan.removable == () and plan.held_jobs == ("41",)
    assert plan.unknown_jobs == (
        ("50", "its script is not one hpcbox rendered"),
        ("51", "no batch script from Slurm: slurm_job_batch_script error: Job has no batch script"),
    )
    said = prune.describe(plan, keep=0)
    assert said[-1] == (
        "nothing to prune: Slurm holds jobs of yours whose files hpcbox cannot tell, which could use any "
        "file here: 50 (its script is not one hpcbox rendered), 51 (no batch script from Slurm: "
        "slurm_job_batch_script error: Job has no batch script)"
    )
    assert not any(line.startswith("  ") for line in said)


# --- what unfinished uploads left -------------------------------------------------------------------


@contextlib.contextmanager
def held(lock: Path) -> Iterator[None]:
    """``lock`` held here, as an upload running on the login node holds its lock (flock on an open file)."""
    with lock.open("a") as file:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield


def leftovers(cluster: LocalConnection) -> dict[str, str]:
    """What two interrupted uploads left (a SIF's part with rsync's temporary beside it, and a
    dataset's part whose lock file is gone), a part an upload is writing now, and an unfinished code
    snapshot folder of this project: their paths."""
    sifs, data = "hpcbox/images/sha256", "hpcbox/data/sha256"
    return {
        "part": put(cluster, f"{sifs}/.{'e' * 64}.sif.partial", 3_000_000),
        "temporary": put(cluster, f"{sifs}/.{'e' * 64}.sif.partial.Ab12Cd", 1_000_000),
        "lock": put(cluster, f"{sifs}/.{'e' * 64}.sif.lock", 0),
        "data part": put(cluster, f"{data}/.{'f' * 64}.tar.partial", 2_000_000),
        "running": put(cluster, f"{sifs}/.{'9' * 64}.sif.partial", 4_000_000),
        "running lock": put(cluster, f"{sifs}/.{'9' * 64}.sif.lock", 0),
        "incoming": put(cluster, "hpcbox/trainer/code/.incoming-Xy12Zw/", 500),
    }


def test_what_unfinished_uploads_left_is_listed_and_removed_under_their_locks_which_stay(
    cluster, monkeypatch
):
    paths = a_store_two_checkouts_use(cluster)
    old_lock = put(cluster, f"hpcbox/images/sha256/.{OLD_SHA}.sif.lock", 0)  # the old SIF's upload's
    left = leftovers(cluster)
    queue(cluster, {})
    with held(Path(left["running lock"])):
        plan = prune.plan(cluster, "trainer", [], root="hpcbox", keep=0)
        assert cluster.commands == 1  # the locks are looked at in the same round trip
        said = prune.describe(plan, keep=0)
        unfinished = sorted(item.path for item in plan.removable if item.unfinished)
        assert unfinished == sorted([left["part"], left["temporary"], left["data part"]])
        assert f"  sif             3.0 MB  unfinished upload: {left['part']}" in said
        assert f"  dataset         2.0 MB  unfinished upload: {left['data part']}" in said
        assert (
            "unfinished upload kept, an upload of it is running now (it holds its lock): "
            f"{left['running']} (4.0 MB)"
        ) in said
        # The code snapshot's folder has no lock: one that changed in the last hour could be a submit's.
        assert (
            "unfinished upload kept, it changed in the last 60 min: a submit may be sending it: "
            f"{left['incoming']} (0.0 MB)"
        ) in said
        removed = prune.apply(cluster, plan, say=said.append)
    assert {item.path for item in removed} == {item.path for item in plan.removable}
    gone = {name for name, path in {**paths, **left}.items() if not Path(path).exists()}
    assert gone == {"old sif", "old code", "sif", "code", "part", "temporary", "data part"}
    # No lock file is removed, the removed SIF's included; one the dataset's part had lost is made again.
    locks = sorted(str(p) for p in (cluster.home / "hpcbox").rglob(".*.lock"))
    made = str(Path(left["data part"]).with_name(f".{'f' * 64}.tar.lock"))
    assert locks == sorted([old_lock, left["lock"], left["running lock"], made])
    assert Path(left["running"]).stat().st_size == 4_000_000
    assert not [line for line in said if line.startswith("hpcbox: kept")]  # kept by the plan already

    # An hour on, the code snapshot's folder goes too (the age in minutes, here none).
    monkeypatch.setattr(prune, "INCOMING_MIN_AGE_MIN", 0)
    later = prune.plan(cluster, "trainer", [], root="hpcbox", keep=0)
    assert [item.path for item in later.removable] == [left["running"], left["incoming"]]
    prune.apply(cluster, later)
    assert not Path(left["incoming"]).exists() and not Path(left["running"]).exists()
    assert prune.describe(prune.plan(cluster, "trainer", [], root="hpcbox", keep=0), keep=0)[-1].startswith(
        "nothing to prune"
    )


def test_a_part_whose_upload_took_its_lock_after_the_plan_is_kept_and_said(cluster):
    a_store_two_checkouts_use(cluster)
    left = leftovers(cluster)
    queue(cluster, {})
    plan = prune.plan(cluster, "trainer", [], root="hpcbox", keep=0)
    assert left["running"] in [item.path for item in plan.removable]  # its lock was free
    said: list[str] = []
    with held(Path(left["lock"])):  # a submit resumes the interrupted upload, after the plan
        removed = prune.apply(cluster, plan, say=said.append)
    assert sorted(said) == [
        f"hpcbox: kept {left['part']} (3.0 MB): an upload of it is running now (it holds its lock)",
        f"hpcbox: kept {left['temporary']} (1.0 MB): an upload of it is running now (it holds its lock)",
    ]
    assert Path(left["part"]).exists() and Path(left["temporary"]).exists()
    assert not Path(left["running"]).exists() and not Path(left["data part"]).exists()
    assert {item.path for item in removed} == {item.path for item in plan.removable} - {
        left["part"],
        left["temporary"],
    }


def test_held_jobs_whose_files_cannot_be_told_keep_every_stored_file_but_not_what_uploads_left(cluster):
    a_store_two_checkouts_use(cluster)
    left = leftovers(cluster)
    queue(cluster, {"50": "#!/bin/sh\nsleep 600\n"})
    plan = prune.plan(cluster, "trainer", [], root="hpcbox", keep=0)
    assert all(item.unfinished for item in plan.removable) and plan.removable
    assert left["part"] in [item.path for item in plan.removable]
    assert prune.describe(plan, keep=0)[-1] == (
        "only unfinished uploads to prune: Slurm holds jobs of yours whose files hpcbox cannot tell, "
        "which could use any file here: 50 (its script is not one hpcbox rendered)"
    )


def test_the_plan_for_people_marks_unfinished_uploads_and_says_why_one_is_kept():
    plan = prune.Plan(
        (
            prune.Removable("sif", "/h/hpcbox/images/sha256/a.sif", 514_129_920),
            prune.Removable(
                "sif",
                "/h/hpcbox/images/sha256/.b.sif.partial",
                312_000_000,
                unfinished=True,
                lock="/h/hpcbox/images/sha256/.b.sif.lock",
            ),
        ),
        kept_jobs=(),
        left_alone=0,
        index_entries=(),
        unfinished_kept=(("/h/hpcbox/data/sha256/.d.tar.partial", 2_500_000, prune.RUNNING),),
    )
    assert prune.describe(plan, keep=None)[2:] == [
        "  sif           514.1 MB  /h/hpcbox/images/sha256/a.sif",
        "  sif           312.0 MB  unfinished upload: /h/hpcbox/images/sha256/.b.sif.partial",
        "unfinished upload kept, an upload of it is running now (it holds its lock): "
        "/h/hpcbox/data/sha256/.d.tar.partial (2.5 MB)",
    ]
