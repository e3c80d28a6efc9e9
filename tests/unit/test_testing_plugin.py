"""hpcbox's pytest plugin (hpcbox.testing) without a cluster: its options as a real pytest reads them, a
session that does not ask for the cluster getting nothing, and the cluster removed at every end a session
can have (passed, failed to start, Ctrl-C, SIGTERM), with start and stop stood in for. The real cluster,
in a project's own test session run by pytest: tests/integration/test_own_project.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from hpcbox.errors import FieldError
from hpcbox.jobs.fetch import local_run_dir
from hpcbox.ledger import Ledger
from hpcbox.minicluster.spec import DEFAULT_NAME, check_name
from hpcbox.project.config import ProjectConfig
from hpcbox.testing import ClusterSettings
from hpcbox.testing.cluster import NAME_PREFIX, orphans, unique_name
from hpcbox.testing.plugin import settings_of
from hpcbox.tools.proc import signals_held

pytest_plugins = ["pytester"]

HEAVY = ("docker", "testcontainers", "invoke", "spython", "matplotlib")


def test_pytest_finds_the_plugin_through_its_entry_point():
    found = {point.name: point.value for point in entry_points(group="pytest11")}
    assert found.get("hpcbox") == "hpcbox.testing.plugin"


def test_without_options_the_cluster_is_shaped_like_local_with_the_profiles_slurm(pytester: pytest.Pytester):
    assert settings_of(pytester.parseconfig()) == ClusterSettings("local", None)


def test_the_ini_file_names_the_profile_and_the_slurm_version(pytester: pytest.Pytester):
    pytester.makeini("[pytest]\nhpcbox_cluster = edi\nhpcbox_slurm = 22.05\n")
    assert settings_of(pytester.parseconfig()) == ClusterSettings("edi", "22.05")


def test_pyproject_names_them_too(pytester: pytest.Pytester):
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\nhpcbox_cluster = "edi"\n')
    assert settings_of(pytester.parseconfig()) == ClusterSettings("edi", None)


def test_the_command_line_wins_over_the_ini_file(pytester: pytest.Pytester):
    pytester.makeini("[pytest]\nhpcbox_cluster = edi\nhpcbox_slurm = 22.05\n")
    config = pytester.parseconfig("--hpcbox-cluster=local", "--hpcbox-slurm", "24.11")
    assert settings_of(config) == ClusterSettings("local", "24.11")


def test_a_bad_version_is_refused_naming_the_option_as_it_was_set(pytester: pytest.Pytester):
    pytester.makeini("[pytest]\nhpcbox_slurm = 99.99\n")
    with pytest.raises(FieldError) as ini:
        settings_of(pytester.parseconfig())
    assert str(ini.value).startswith("hpcbox_slurm: '99.99' is not a Slurm version the mini cluster runs")
    with pytest.raises(FieldError) as flag:
        settings_of(pytester.parseconfig("--hpcbox-slurm=23"))
    assert str(flag.value).startswith("--hpcbox-slurm: '23' is not a Slurm version")


def test_an_unknown_profile_is_refused_with_the_known_ones(pytester: pytest.Pytester):
    pytester.makeini("[pytest]\nhpcbox_cluster = nowhere\n")
    with pytest.raises(FieldError) as refused:
        settings_of(pytester.parseconfig())
    assert str(refused.value).startswith("hpcbox_cluster: no profile named 'nowhere' (allowed: ")
    assert "edi" in str(refused.value) and "local" in str(refused.value)


def test_each_session_names_its_cluster_anew_and_never_as_the_users_own():
    names = {unique_name() for _ in range(50)}
    assert len(names) == 50
    for name in names:
        assert check_name(name) == name and name.startswith(NAME_PREFIX) and name != DEFAULT_NAME


def test_a_projects_ledger_and_results_can_live_elsewhere(tmp_path: Path):
    """The session's jobs count from 1 on a fresh cluster: their records and results go to its folder,
    not over those of the user's own `local` jobs."""
    from hpcbox.ledger import JobRecord

    plain = ProjectConfig(root=tmp_path, name="p", code=())
    moved = ProjectConfig(
        root=tmp_path, name="p", code=(), ledger_dir=tmp_path / "s/jobs", results_dir=tmp_path / "s/runs"
    )
    assert Ledger(plain).directory == tmp_path / ".hpcbox" / "jobs"
    assert Ledger(moved).directory == tmp_path / "s" / "jobs"
    record = JobRecord(
        "1", "local", "researcher@127.0.0.1:2222", "now", "/s", "/s/j.sh", "/s/l", "/s/r", "/s/i.sif",
        "0", "img", "rev", "/s/c", "0", {}, (),
    )  # fmt: skip
    assert local_run_dir(plain, record) == tmp_path / "runs" / "local" / "1"
    assert local_run_dir(moved, record) == tmp_path / "s" / "runs" / "local" / "1"


def test_a_session_that_asks_for_no_cluster_gets_nothing_but_the_options(pytester: pytest.Pytester):
    pytester.makepyfile(
        test_plain=f"""
import sys

def test_nothing_heavy_was_loaded():
    loaded = {{name.split(".")[0] for name in sys.modules}} & set({HEAVY!r})
    assert not loaded
    assert "hpcbox.minicluster" not in sys.modules and "hpcbox.api" not in sys.modules
"""
    )
    ran = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--hpcbox-cluster=edi")
    ran.assert_outcomes(passed=1)
    assert "hpcbox:" not in ran.stdout.str()
    helped = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--help")
    assert "--hpcbox-cluster=PROFILE" in helped.stdout.str() and "hpcbox_slurm" in helped.stdout.str()


# A conftest standing in for the cluster's start and stop: each call noted in calls.jsonl, with the
# state folder hpcbox reads while the session runs, so that every way a session ends is seen to stop
# what it started.
STAND_IN = """
import json, os
from pathlib import Path
from types import SimpleNamespace

from hpcbox.errors import HpcboxError
from hpcbox.testing import cluster

CALLS = Path(__file__).parent / "calls.jsonl"


def note(**what):
    with CALLS.open("a") as calls:
        calls.write(json.dumps(what) + "\\n")


def start(name, settings, project_root, folder, *, say):
    note(call="start", name=name, state=os.environ.get("HPCBOX_MINICLUSTER_STATE"), folder=str(folder))
    if os.environ.get("FAIL_START"):
        raise HpcboxError("the engine said no", "start it")
    return SimpleNamespace(name=name, profile=settings.profile, slurm=settings.slurm or "24.11")


def stop(name, folder):
    note(call="stop", name=name)
    return SimpleNamespace(containers=("a", "b"), networks=("n",), volumes=())


cluster.start, cluster.stop = start, stop
"""


@pytest.fixture
def own_private_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary folder of the test's own (TMPDIR, here and in what it starts), so that the sessions
    it runs find only their own clusters' owner files: never those of real sessions beside it (the
    stand-in stop would leave such a cluster up and take its owner file)."""
    folder = tmp_path / "tmpdir"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    return folder


@pytest.fixture
def stand_in(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, own_private_folder
) -> pytest.Pytester:
    """pytester with STAND_IN as its conftest; the real start and stop put back after the test (a
    session run in this process replaces them)."""
    from hpcbox.testing import cluster

    monkeypatch.setattr(cluster, "start", cluster.start)
    monkeypatch.setattr(cluster, "stop", cluster.stop)
    pytester.makeconftest(STAND_IN)
    return pytester


def _calls(pytester: pytest.Pytester) -> list[dict]:
    path = pytester.path / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_one_cluster_per_session_shared_by_its_tests_and_removed_at_its_end(stand_in: pytest.Pytester):
    pytester = stand_in
    pytester.makepyfile(
        test_two="""
import os

def test_one(hpcbox_cluster):
    assert os.environ["HPCBOX_MINICLUSTER_STATE"].endswith("state")

def test_two(hpcbox_cluster):
    assert hpcbox_cluster.name.startswith("hpcbox-pytest-")
"""
    )
    ran = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--hpcbox-slurm=22.05")
    ran.assert_outcomes(passed=2)
    calls = _calls(pytester)
    assert [call["call"] for call in calls] == ["start", "stop"]
    assert calls[0]["name"] == calls[1]["name"]
    # The keys' folder is the session's own, under pytest's temporary folder, and hpcbox finds it there.
    assert calls[0]["state"] == str(Path(calls[0]["folder"]) / "state")
    said = ran.stdout.str()
    assert f"hpcbox: mini cluster {calls[0]['name']} is up (like local, Slurm 22.05)" in said
    assert f"hpcbox: removed mini cluster {calls[0]['name']}: 2 containers, 1 network(s), 0 volume(s)" in said


def test_a_start_that_fails_is_one_line_and_leaves_nothing(stand_in: pytest.Pytester, monkeypatch):
    pytester = stand_in
    pytester.makepyfile(test_one="def test_one(hpcbox_cluster):\n    pass\n")
    monkeypatch.setenv("FAIL_START", "1")
    ran = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    ran.assert_outcomes(errors=1)
    assert [call["call"] for call in _calls(pytester)] == ["start", "stop"]
    ran.stdout.fnmatch_lines(["*hpcbox_cluster: the engine said no (start it)"])
    assert "Traceback" not in ran.stdout.str()


def test_a_bad_option_fails_the_tests_that_ask_before_anything_starts(stand_in: pytest.Pytester):
    pytester = stand_in
    pytester.makeini("[pytest]\nhpcbox_slurm = 99.99\n")
    pytester.makepyfile(
        test_some="def test_asks(hpcbox_cluster):\n    pass\n\ndef test_does_not():\n    pass\n"
    )
    ran = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    ran.assert_outcomes(passed=1, errors=1)
    ran.stdout.fnmatch_lines(["*hpcbox_cluster: hpcbox_slurm: '99.99' is not a Slurm version*"])
    assert _calls(pytester) == []


WAITS = """
import os, signal, time

def test_waits_on_a_job(hpcbox_cluster):
    {interrupt}
    time.sleep(30)

def test_never_runs(hpcbox_cluster):
    pass
"""


def test_a_session_interrupted_by_ctrl_c_still_removes_its_cluster(stand_in: pytest.Pytester):
    """pytest tears the session down after Ctrl-C (the KeyboardInterrupt SIGINT raises; a real SIGINT to
    a real cluster's session: tests/integration/test_own_project.py)."""
    pytester = stand_in
    pytester.makepyfile(test_waits=WAITS.format(interrupt="raise KeyboardInterrupt"))
    ran = pytester.runpytest_inprocess("-p", "no:cacheprovider", no_reraise_ctrlc=True)
    assert ran.ret == pytest.ExitCode.INTERRUPTED
    assert [call["call"] for call in _calls(pytester)] == ["start", "stop"]
    assert "hpcbox: removed mini cluster hpcbox-pytest-" in ran.stdout.str()


def test_sigterm_interrupts_the_session_as_ctrl_c_does(pytester: pytest.Pytester, own_private_folder):
    """As a CI runner cancelling a job sends it: without the plugin's handler, SIGTERM would end pytest
    at once and leave the cluster running."""
    pytester.makeconftest(STAND_IN)
    pytester.makepyfile(test_waits=WAITS.format(interrupt="os.kill(os.getpid(), signal.SIGTERM)"))
    started = time.monotonic()
    ran = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=60)
    assert time.monotonic() - started < 20  # interrupted, not slept through
    assert ran.ret == pytest.ExitCode.INTERRUPTED
    assert [call["call"] for call in _calls(pytester)] == ["start", "stop"]
    assert "hpcbox: removed mini cluster hpcbox-pytest-" in ran.stdout.str()


# A process that owns a session cluster (its owner file flock'ed) until it is killed.
OWNER = """
import sys, time
from pathlib import Path
from hpcbox.testing.cluster import _owned
with _owned(sys.argv[1], Path(sys.argv[2])):
    print("owned", flush=True)
    time.sleep(600)
"""


def test_a_cluster_whose_session_was_killed_outright_is_found_and_a_running_sessions_is_not(
    own_private_folder: Path, tmp_path: Path
):
    """What a session finds before it starts its own: the cluster of one killed by SIGKILL (no clean-up
    ran) with its session's folder, and never the cluster of one that runs."""
    owners = []
    for name in (f"{NAME_PREFIX}00000001", f"{NAME_PREFIX}00000002"):
        (tmp_path / name).mkdir()
        owner = subprocess.Popen(
            [sys.executable, "-c", OWNER, name, str(tmp_path / name)], stdout=subprocess.PIPE, text=True
        )
        assert owner.stdout is not None and owner.stdout.readline() == "owned\n"
        owners.append(owner)
    running, killed = owners
    try:
        killed.kill()
        killed.wait(10)
        found = list(orphans())
        assert found == [(f"{NAME_PREFIX}00000002", tmp_path / f"{NAME_PREFIX}00000002")]
        assert list(orphans()) == []  # its owner file went once it was named
        running.kill()
        running.wait(10)
        (tmp_path / f"{NAME_PREFIX}00000001").rmdir()  # its session's temporary files gone too
        assert list(orphans()) == [(f"{NAME_PREFIX}00000001", None)]
    finally:
        for owner in owners:
            owner.kill()
            owner.wait(10)


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="signals reach the main thread alone"
)
def test_signals_during_the_removal_are_held_off_until_it_is_done():
    # Python's own Ctrl-C handler, as where SIGINT is not ignored (a suite run in the background ignores
    # it, and signals_held leaves a signal the process ignores alone)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with signals_held() as held:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # Python runs a handler between bytecodes of the main thread
        assert held == ["SIGINT", "SIGTERM"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


def test_the_plugin_imports_nothing_heavy():
    code = (
        "import sys, hpcbox.testing.plugin; "
        f"print(sorted({{name.split('.')[0] for name in sys.modules}} & set({HEAVY!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
