"""The doctor's probe script, run by this machine's own bash (no Slurm here): every probe reports, the
missing ones as what they are. Against a real login node: tests/integration/test_doctor.py."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import time
from pathlib import Path

from hpcbox.render import profiles
from hpcbox.survey.doctor import (
    DIFFERS,
    FAILS,
    LOGIN,
    LOGIN_FIX,
    OK,
    Finding,
    Probed,
    _how_far,
    failed,
    findings,
    first_look,
    parse_probes,
    probe_commands,
    probing,
    render,
    sif_line,
    stored_sifs,
    try_sifs,
)
from hpcbox.testing.transport import MockTransport
from hpcbox.tools import ssh

PROBES = {
    "slurm", "squeue", "sacct", "partitions", "associations", "module", "runtime", "userns", "fuse",
    "setuid", "areas", "quota", "machine", "probe_sifs", "queue",
}  # fmt: skip


def run_here(profile: profiles.ClusterProfile, home: Path) -> str:
    environment = {"PATH": "/usr/bin:/bin", "HOME": str(home), "USER": "nobody"}
    done = subprocess.run(
        ["bash", "-lc", probing(probe_commands(profile))],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_probe_reports_and_a_machine_without_slurm_fails_in_the_slurm_lines(tmp_path: Path):
    assert shutil.which("sinfo", path="/usr/bin:/bin") is None  # as on any machine but a login node
    local = profiles.load_profile("local")
    probed = parse_probes(run_here(local, tmp_path))
    assert set(probed) == PROBES
    assert probed["slurm"].status == 127 and "sinfo" in probed["slurm"].output
    assert probed["userns"].answered and probed["userns"].output.isdigit()
    found = findings(local, probed)
    by_topic = {finding.topic: finding for finding in found}
    assert by_topic["slurm"].verdict == FAILS and by_topic["slurm"].fix == "is Slurm's client there?"
    assert by_topic["scheduler"].verdict == FAILS and by_topic["partitions"].verdict == FAILS
    assert by_topic["quota"].verdict == OK
    assert failed(found)
    target = ssh.Target("login.example.org", user="me")
    table = render(local, target, found, 0.25).splitlines()
    assert table[0] == "hpcbox doctor: local at me@login.example.org, 0.2 s"
    assert table[-1].startswith(f"{sum(f.verdict == FAILS for f in found)} checks would fail a job")
    assert table[1].split()[:2] == ["fails", "slurm"]


def test_only_the_doctor_asks_slurm_to_guess_a_start_as_sbatch_test_only_takes_a_job_id():
    """`sbatch --test-only` numbers its answer with a job id of the site's: the doctor's queue line asks
    it, the first look a submit takes does not (a fresh mini cluster's first job is then job 1)."""
    local = profiles.load_profile("local")
    assert "--test-only" in probe_commands(local)["queue"]
    assert not any("--test-only" in body for body in probe_commands(local, queue=False).values())
    assert [finding.topic for finding in findings(local, {})][-1] == "quota"


def test_a_storage_area_named_by_a_variable_is_expanded_where_the_probe_runs(tmp_path: Path):
    mila = profiles.load_profile("mila")  # home = "$HOME", scratch = "$SCRATCH"
    found = findings(mila, parse_probes(run_here(mila, tmp_path)))
    storage = {finding.seen.split()[0]: finding for finding in found if finding.topic == "storage"}
    assert storage["home"].verdict == OK and storage["home"].seen.endswith("GB free")
    assert storage["scratch"].verdict != OK and storage["scratch"].fix == "[storage] scratch"  # unset here


def test_the_probe_program_is_a_static_true_this_machine_runs(tmp_path: Path):
    import os
    import platform

    from hpcbox.sif import probe

    program = tmp_path / "true"
    program.write_bytes(probe.true_program(platform.machine()))
    program.chmod(0o755)
    assert subprocess.run([str(program)], env={}, check=False).returncode == 0
    assert len(program.read_bytes()) < 200 and b"ld-linux" not in program.read_bytes()  # no loader
    assert os.path.getsize(program) == len(probe.true_program(platform.machine()))


# What Apptainer 1.4 printed on the mini cluster's login node, for the probe SIFs (test_container_software
# gets each of these from the real runtime).
ZSTD_REFUSED = (
    "FATAL:   container creation failed: image driver mount failure: image driver squashfuse_ll instance "
    "exited with error: squashfuse_ll exited: Squashfs image uses zstd compression, this version supports "
    "only zlib, xz, lzo, lz4."
)
EXTRACTED = (
    "INFO:    squashfuse not found, will not be able to mount SIF or other squashfs files\n"
    "INFO:    Converting SIF file to temporary sandbox...\nINFO:    Cleaning up image..."
)


def sif_probes(mount: dict[str, tuple[int, str]], unpacks: bool = True) -> dict[str, Probed]:
    """Each probe SIF's probe as the probe script reports it: the mount's output, and where it failed,
    the unpacking's marker line and its status (3: unpacked, it ran)."""
    probed = {}
    for algorithm in ("gzip", "zstd", "lzo", "xz", "lz4"):
        status, output = mount.get(algorithm, (0, ""))
        if status not in (0, 124):
            output, status = f"{output}\nhpcbox-probe-unpacking", 3 if unpacks else 1
        probed[f"sif:{algorithm}"] = Probed(output, status)
    return probed


def sif_finding(profile: profiles.ClusterProfile, probed: dict[str, Probed]):
    return sif_line(profile, probed)


def test_a_profile_whose_compression_does_not_mount_where_another_does_fails_with_that_one():
    local = profiles.load_profile("local")  # ships zstd:3
    finding = sif_finding(local, sif_probes({"zstd": (255, ZSTD_REFUSED)}))
    assert finding.verdict == FAILS and finding.fix == '[apptainer] compression = "gzip:1"'
    assert finding.seen.endswith(
        "does not mount on the login node: Squashfs image uses zstd compression, this version supports only "
        "zlib, xz, lzo, lz4.; gzip, lzo, xz, lz4 mount"
    )
    fuse_false = dataclasses.replace(local, apptainer=dataclasses.replace(local.apptainer, fuse=False))
    assert sif_finding(fuse_false, sif_probes({"zstd": (255, ZSTD_REFUSED)})).verdict == OK


def test_a_sif_probe_that_did_not_answer_by_the_deadline_is_unknown_not_a_failure():
    """A busy login node, not a runtime that cannot mount: what Apptainer printed before the deadline
    (a warning) is no reason, and no unpacking was tried."""
    local = profiles.load_profile("local")
    late = (124, "WARNING: gocryptfs not found, will not be able to use gocryptfs")
    finding = sif_finding(local, sif_probes({"zstd": late}))
    assert (
        finding.verdict == DIFFERS and finding.fix == "run the doctor again when the login node is less busy"
    )
    assert finding.seen == (
        "a zstd SIF (the profile's): no answer by the probes' deadline (it said: WARNING: gocryptfs not "
        "found, will not be able to use gocryptfs)"
    )


def test_a_sif_apptainer_extracts_for_each_run_fails_unless_the_profile_says_jobs_unpack():
    local = profiles.load_profile("local")
    everything = {algorithm: (0, EXTRACTED) for algorithm in ("gzip", "zstd", "lzo", "xz", "lz4")}
    finding = sif_finding(local, sif_probes(everything))
    assert finding.verdict == FAILS and finding.fix.startswith("[apptainer] fuse = false")
    fuse_false = dataclasses.replace(local, apptainer=dataclasses.replace(local.apptainer, fuse=False))
    assert sif_finding(fuse_false, sif_probes(everything)).verdict == OK


def test_a_sif_that_neither_mounts_nor_unpacks_anywhere_sends_the_user_to_the_site():
    local = profiles.load_profile("local")
    nothing = {algorithm: (255, "FATAL:   no way") for algorithm in ("gzip", "zstd", "lzo", "xz", "lz4")}
    finding = sif_finding(local, sif_probes(nothing, unpacks=False))
    assert (finding.verdict, finding.fix) == (FAILS, "ask the site how to run a SIF there")
    assert finding.seen.endswith("does not mount on the login node: no way, nor runs unpacked")


def test_probe_sifs_that_could_not_be_made_are_a_line_saying_so_and_none_where_the_runtime_fails():
    """Neither asks the login node anything: the connection given is never opened."""
    local = profiles.load_profile("local")
    nowhere = ssh.Connection(ssh.Target("login.example.org"))
    untried = {"runtime": Probed("apptainer version 1.4.5", 0), "machine": Probed("riscv64", 0)}
    line = try_sifs(nowhere, local, untried, print)
    assert line == Finding(
        DIFFERS, "sif", "not tried: no probe SIF for a riscv64", "run it where Docker runs"
    )
    assert try_sifs(nowhere, local, {"runtime": Probed("", 127)}, print) is None
    found = findings(local, {"runtime": Probed("", 127)}, sif=None)
    assert not [finding for finding in found if finding.topic == "sif"]


def test_a_probe_sif_the_login_node_keeps_only_in_part_is_sent_again():
    """An upload cut short at the doctor's deadline leaves part of the file under its name (rsync's
    --partial): only a file whose content is its name counts as there."""
    whole = "a" * 64
    listed = Probed(f"{whole}  {whole}.sif\n{'b' * 64}  {'c' * 64}.sif", 0)
    assert stored_sifs(listed) == {f"{whole}.sif"}


def test_the_probes_run_at_once_under_one_deadline_and_one_that_hangs_is_named_as_such(tmp_path: Path):
    """Three probes of 2 s each and one that never ends, deadline 4 s: the script takes about 4 s (not
    10), the three report, the hung one says it did not answer, and a function of the shell that runs
    the script (Lmod's `module` is one, from the login profile) reaches every probe."""
    probes = {f"slow{n}": f"sleep 2; echo done {n}" for n in range(3)}
    probes["hangs"] = "echo started; exec sleep 600"
    probes["function"] = "module"
    script = "module() { echo module is a function here; }\n" + probing(probes, deadline_s=4)
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    probed = parse_probes(done.stdout)
    assert [probed[f"slow{n}"].output for n in range(3)] == ["done 0", "done 1", "done 2"]
    assert probed["function"].output == "module is a function here"
    assert probed["hangs"].timed_out and not probed["hangs"].answered
    assert probed["hangs"].last_line == "no answer by the probes' deadline (it said: started)"
    # At once: the deadline (4 s) and timeout's kill a second later, whatever a busy machine adds; in
    # turn the same probes would take 10 s (three of 2 s, then the hung one's 4).
    assert 3.5 < took < 9.5, took


def test_the_probes_get_what_a_slow_login_shell_left_of_the_time_and_say_how_long_it_took():
    """A login shell that took 1 s to start, with 4 s in all: the probes' deadline is 1 s (4, less the
    start, less 2 for the kill and the report), not 5; with 2 s in all none is left, and the script says
    only how long the start took."""
    probes = {"quick": "echo here", "hangs": "exec sleep 600"}
    # The start's second, as a slow login profile leaves bash's SECONDS: a `sleep 1` here read 2 in a
    # full run (SECONDS counts whole-second boundaries crossed, and a busy machine adds to the sleep).
    slow_start = "SECONDS=1\n"
    done = subprocess.run(
        ["bash", "-c", slow_start + probing(probes, within_s=4)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    probed = parse_probes(done.stdout)
    assert probed["quick"].output == "here" and probed["hangs"].timed_out
    assert done.stdout.splitlines()[0] == "@@hpcbox-probe-login-took 1"
    late = subprocess.run(
        ["bash", "-c", slow_start + probing(probes, within_s=2)], capture_output=True, text=True, timeout=60
    )
    assert late.returncode == 124 and parse_probes(late.stdout) == {}
    assert (
        _how_far(late.stdout, 2.2)
        == "the login shell took 1 s to start, and its probes did not report in 2 s"
    )
    assert _how_far("", 17.4) == "the login shell did not start in 17 s"


def test_no_login_shell_by_the_deadline_is_one_line_and_the_site_not_checked():
    local = profiles.load_profile("local")
    found = [
        Finding(
            FAILS,
            LOGIN,
            "no answer by the doctor's deadline: the login shell did not start in 17 s",
            LOGIN_FIX,
        )
    ]
    table = render(local, ssh.Target("login.example.org"), found, 18.25).splitlines()
    assert len(table) == 3 and table[1].split()[:2] == ["fails", "login"]
    assert table[-1] == "the site was not checked: no login shell answered by the doctor's deadline"
    assert failed(found)


def test_submit_asks_each_login_of_a_profile_once_whichever_was_asked_last(tmp_path: Path):
    """Found by bench_race: a race's two mini clusters, both of profile `local`, were asked by turns, each
    answer remembered in the place of the other's, so every submit to one of them asked again."""
    local = profiles.load_profile("local")
    transport = MockTransport(lambda _command: "")

    def first_look_at(host: str) -> list[Finding] | None:
        with transport(ssh.Target(host)) as connection:
            return first_look(connection, local, tmp_path, say=lambda _line: None)

    assert first_look_at("login-a") is not None and first_look_at("login-b") is not None
    asked = len(transport.commands)
    assert first_look_at("login-a") is None and first_look_at("login-b") is None
    assert len(transport.commands) == asked == 2
