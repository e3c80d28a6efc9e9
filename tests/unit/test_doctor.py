"""The doctor's probe script, run by this machine's own bash (no Slurm here): every probe reports, the
missing ones as what they are. Against a real login node: tests/integration/test_doctor.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from hpcbox.jobs.doctor import FAILS, OK, failed, findings, parse_probes, probe_script, render
from hpcbox.render import profiles
from hpcbox.tools import ssh

PROBES = {
    "slurm", "squeue", "sacct", "partitions", "associations", "module", "runtime", "userns", "fuse",
    "setuid", "areas", "quota",
}  # fmt: skip


def run_here(profile: profiles.ClusterProfile, home: Path) -> str:
    environment = {"PATH": "/usr/bin:/bin", "HOME": str(home), "USER": "nobody"}
    done = subprocess.run(
        ["bash", "-c", probe_script(profile)], capture_output=True, text=True, env=environment, timeout=120
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


def test_a_storage_area_named_by_a_variable_is_expanded_where_the_probe_runs(tmp_path: Path):
    mila = profiles.load_profile("mila")  # home = "$HOME", scratch = "$SCRATCH"
    found = findings(mila, parse_probes(run_here(mila, tmp_path)))
    storage = {finding.seen.split()[0]: finding for finding in found if finding.topic == "storage"}
    assert storage["home"].verdict == OK and storage["home"].seen.endswith("GB free")
    assert storage["scratch"].verdict != OK and storage["scratch"].fix == "[storage] scratch"  # unset here
