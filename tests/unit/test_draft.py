"""`hpcbox profile.draft`, the parts that read what a site printed and write the profile: Slurm's own
output, captured from the mini cluster shaped like M3 (tests/unit/data/draft/), read back into a profile
hpcbox loads. The whole command against real clusters is in tests/integration/test_rehearsal.py."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest

from hpcbox.errors import FieldError, HpcboxError
from hpcbox.render import profiles
from hpcbox.survey import draft
from hpcbox.survey.doctor import Probed
from hpcbox.tools import ssh

DATA = Path(__file__).resolve().parent / "data" / "draft"
TARGET = ssh.Target("login.example.edu", 2222, "someone")


def seen(scontrol: str = "m3.scontrol") -> tuple[draft.SeenPartition, ...]:
    return draft.parse_partitions((DATA / scontrol).read_text(), (DATA / "m3.sinfo").read_text())


def site(**answers: Probed) -> draft.Site:
    probed = {
        "slurm": Probed("slurm 24.11.5", 0),
        "partitions": Probed((DATA / "m3.scontrol").read_text(), 0),
        "gres": Probed((DATA / "m3.sinfo").read_text(), 0),
        "associations": Probed("research|desktopq,normal\nvf68|normal", 0),
        "default_account": Probed("research", 0),
        "runtime": Probed("apptainer /usr/bin/apptainer\napptainer version 1.4.5", 0),
        "modules": Probed("", 1),
        "areas": Probed("project=\nscratch=/scratch/someone", 0),
        **answers,
    }
    return draft.read_site(probed, TARGET.address)


def test_partitions_as_scontrol_and_sinfo_print_them():
    m3g, m3h, desktop = seen()
    assert (m3g.name, m3g.default, m3g.max_time, m3g.nodes, m3g.state) == ("m3g", True, None, 1, "UP")
    assert (m3g.gpu_types, m3g.gpus_per_node, m3g.qos) == (("V100",), 2, None)
    assert (m3h.default, m3h.gpu_types) == (False, ("P100",))
    assert (desktop.qos, desktop.gpu_types) == ("desktopq", ("P4",))
    *_, empty = seen("m3-empty.scontrol")
    # No sinfo line for a partition without nodes: its gres are not seen, not none.
    assert (empty.name, empty.nodes, empty.max_time, empty.gres) == ("hpcbox-empty", 0, "00:30:00", None)


@pytest.mark.parametrize(
    ("gres", "types", "per_node"),
    [
        ("gpu:a100:4(S:0-1),gpu:v100:2", ("a100", "v100"), 6),
        ("gpu:2(S:0)", (), 2),
        ("gpu:a100_3g.20gb:7", ("a100_3g.20gb",), 7),
        ("(null)", (), 0),
    ],
)
def test_gpu_types_and_counts_from_a_nodes_gres(gres: str, types, per_node: int):
    partition = draft.SeenPartition("p", False, None, 1, "UP", (), (gres,))
    assert (partition.gpu_types, partition.gpus_per_node) == (types, per_node)


def test_the_site_from_the_login_nodes_answers():
    found = site()
    assert found.slurm_version == "24.11.5"
    assert (found.accounts, found.default_account, found.qos) == (
        ("research", "vf68"),
        "research",
        ("desktopq", "normal"),
    )
    assert (found.runtime, found.runtime_seen, found.modules) == (
        "apptainer",
        "/usr/bin/apptainer, apptainer version 1.4.5",
        False,
    )
    assert found.areas == {"scratch": "$SCRATCH"}  # set at login; $PROJECT was empty


def test_a_runtime_only_as_a_module_is_loaded_by_the_draft():
    lmod = Probed("function\n/opt/modulefiles:\napptainer/1.2.5(default)\napptainer/1.3.1", 0)
    found = site(runtime=Probed("", 1), modules=lmod)
    assert (found.runtime, found.runtime_module, found.modules) == (None, "apptainer", True)
    made = draft.compose(
        TARGET, found, found.partitions, (), draft.Rules(False, False, True), None, today="d"
    )
    assert tomllib.loads(made.text)["apptainer"] == {
        "command": "apptainer",
        "setup": ["module load apptainer"],
    }
    assert "apptainer.setup" not in made.assumed


def test_a_host_without_slurm_is_refused_in_one_line():
    with pytest.raises(HpcboxError) as caught:
        site(slurm=Probed("bash: line 1: sinfo: command not found", 127))
    assert caught.value.message == (
        "someone@login.example.edu:2222 has no Slurm to draft a profile from: `sinfo --version` failed "
        "(bash: line 1: sinfo: command not found)"
    )


def test_partitions_named_must_exist_and_have_nodes():
    found = draft.Site("24.11.5", seen("m3-empty.scontrol"), (), None, (), None, "", None, False)
    chosen, left_out = draft.choose(found, ())
    assert [p.name for p in chosen] == ["m3g", "m3h", "desktop"] and [p.name for p in left_out] == [
        "hpcbox-empty"
    ]
    assert [p.name for p in draft.choose(found, ("desktop", "m3h"))[0]] == ["desktop", "m3h"]
    for named, says in [
        ("hpcbox-empty", "'hpcbox-empty' has no nodes"),
        ("gpu", "'gpu' is not a partition here"),
    ]:
        with pytest.raises(FieldError) as caught:
            draft.choose(found, (named,))
        assert caught.value.field == "partitions" and says in caught.value.message


@pytest.mark.parametrize(
    ("printed", "scratch"),
    [
        # The Alliance's layout: a folder per job, named by the variable the site sets.
        (
            "jobdir TMPDIR /tmp/job.12 tmpfs\njobdir SLURM_TMPDIR /ls/me.12.0 xfs\ndir /lscratch xfs",
            "$SLURM_TMPDIR",
        ),
        # A node-local disk; the shared file system's folder is not node scratch.
        (
            "jobdir WORKDIR /gpfs/work/12 gpfs\ndir /scratch_local nfs\ndir /disk/scratch ext4",
            "/disk/scratch",
        ),
        ("jobdir WORK /home/me/12 nfs4", None),  # nothing node-local but /tmp, which every node has
    ],
)
def test_node_scratch_from_what_the_probe_job_printed(printed: str, scratch):
    output = "\n".join(f"@@hpcbox-probe-job {line}" for line in printed.splitlines())
    node = draft.parse_probe_job(f"@@hpcbox-probe-job node n1\n{output}\n@@hpcbox-probe-job internet no\n")
    assert (node.node, node.scratch, node.internet, node.runtime) == ("n1", scratch, False, None)


def test_the_probe_job_script_is_bash_that_passes_shellcheck():
    *_, desktop = seen()
    text = draft.probe_job_script(desktop, ("--account=research",))
    assert "#SBATCH --partition=desktop\n" in text and "#SBATCH --qos=desktopq\n" in text
    assert "#SBATCH --account=research\n" in text and "#SBATCH --time=1\n" in text
    checked = subprocess.run(["shellcheck", "--shell=bash", "-"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout


def test_the_draft_is_a_profile_with_every_unseen_fact_marked():
    found = site()
    rules = draft.Rules(True, False, True, ("sbatch --test-only on m3g with no account or QOS: refused (x)",))
    made = draft.compose(TARGET, found, found.partitions, (), rules, None, today="2026-11-26")
    profile = profiles.parse_profile(tomllib.loads(made.text), name="m3like")
    assert (profile.account_required, profile.qos_required, profile.gpu_type_required) == (True, False, True)
    assert profile.accounts == ("research", "vf68") and profile.slurm_version == "24.11.5"
    assert [(p.name, p.gpu_types, p.qos, p.max_time_s, p.default) for p in profile.partitions] == [
        ("m3g", ("V100",), None, None, True),
        ("m3h", ("P100",), None, None, False),
        ("desktop", ("P4",), "desktopq", None, False),
    ]
    # No probe job: node scratch is generic, and every job script names it; internet is unknown.
    assert dict(profile.assumed) == {"storage.node_scratch": '"/tmp"'}
    assert profile.compute_internet is None and profile.partition("m3g").cpus_per_gpu is None
    assert made.unknown[0] == "compute_internet"
    assert (profile.login.host, profile.login.port, profile.login.user) == (
        "login.example.edu",
        2222,
        "someone",
    )


def test_with_a_probe_job_node_scratch_and_internet_are_known():
    node = draft.ComputeNode(
        "n1", "$SLURM_TMPDIR", "$SLURM_TMPDIR=/localscratch/me.12.0 (xfs), set per job", "apptainer", True
    )
    found = site()
    made = draft.compose(
        TARGET, found, found.partitions, (), draft.Rules(False, False, False), node, today="d"
    )
    profile = profiles.parse_profile(tomllib.loads(made.text), name="probed")
    assert (profile.node_scratch, profile.compute_internet, profile.assumed) == ("$SLURM_TMPDIR", True, ())


def test_what_test_only_could_not_tell_is_assumed():
    found = site()
    made = draft.compose(TARGET, found, found.partitions, (), draft.Rules(None, None, None), None, today="d")
    assert set(made.assumed) >= {
        "accounting.account_required",
        "accounting.qos_required",
        "gpus.type_required",
    }
    profiles.parse_profile(tomllib.loads(made.text), name="unsure")


def test_a_runtime_on_path_at_a_site_with_modules_is_assumed_to_need_no_setup():
    found = site(modules=Probed("file\nmodule (stub): loads nothing", 0))
    made = draft.compose(
        TARGET, found, found.partitions, (), draft.Rules(False, False, False), None, today="d"
    )
    assert "apptainer.setup" in made.assumed


@pytest.mark.parametrize(
    ("name", "says"),
    [("site.txt", "is not a profile file name"), ("a b.toml", "is not a profile file name"),
     ("there.toml", "exists"), ("missing/site.toml", "is not a folder")],
)  # fmt: skip
def test_an_output_that_would_overwrite_or_is_no_profile_is_refused(tmp_path: Path, name: str, says: str):
    (tmp_path / "there.toml").write_text("kept")
    with pytest.raises(FieldError) as caught:
        draft.check_output(tmp_path / name)
    assert caught.value.field == "output" and says in caught.value.message
    assert (tmp_path / "there.toml").read_text() == "kept"
    assert draft.check_output(tmp_path / "new-site.toml") == "new-site"


@pytest.mark.parametrize(
    ("hostlist", "names"),
    [
        ("n[388-392,423-427]", {f"n{i}" for i in (*range(388, 393), *range(423, 428))}),
        ("g32[1-3],g338", {"g321", "g322", "g323", "g338"}),
        ("r07c[07-09,53]", {"r07c07", "r07c08", "r07c09", "r07c53"}),
        ("rack[1-2]-n[01-02]", {"rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"}),
        ("node1", {"node1"}),
        ("(null)", set()),
    ],
)
def test_node_names_of_a_hostlist_as_scontrol_prints_it(hostlist: str, names: set[str]):
    assert draft.hostnames(hostlist) == names


def test_a_site_whose_every_partition_is_closed_to_the_user_is_refused_in_one_line():
    scontrol = (DATA / "m3.scontrol").read_text().replace("AllowGroups=ALL", "AllowGroups=m3staff")
    found = site(partitions=Probed(scontrol, 0))
    with pytest.raises(HpcboxError) as caught:
        draft.choose(found, ())
    assert caught.value.message == (
        "no partition here is open to you (m3g: AllowGroups=m3staff, and your groups were not asked; "
        "m3h: AllowGroups=m3staff, and your groups were not asked; "
        "desktop: AllowGroups=m3staff, and your groups were not asked)"
    )
    # Named, one is drafted all the same, its list in its notes.
    chosen, left_out = draft.choose(found, ("m3g",))
    made = draft.compose(TARGET, found, chosen, left_out, draft.Rules(False, False, False), None, today="d")
    assert (
        tomllib.loads(made.text)["partitions"][0]["notes"]
        == "1 node, UP; gres gpu:V100:2; AllowGroups=m3staff"
    )
