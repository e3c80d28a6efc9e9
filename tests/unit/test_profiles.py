"""Cluster profiles: the shipped ones load, user ones shadow them, and mistakes name the key at fault."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from hpcbox.errors import HpcboxError
from hpcbox.render import profiles
from hpcbox.render.resources import FieldError

SHIPPED = ("alliance", "carc", "dtu", "edi", "local", "m3", "mila")

MINIMAL = """
compute_internet = false
[login]
host = "login.example.org"
[gpus]
request = "gres"
[storage]
node_scratch = "/tmp"
[[partitions]]
name = "gpu"
max_time = "1-00:00:00"
gpus_per_node = 4
gpu_types = ["a100"]
cpus_per_gpu = 8
"""


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "clusters"
    directory.mkdir()
    monkeypatch.setenv("HPCBOX_CLUSTERS_DIR", str(directory))
    return directory


def test_every_shipped_profile_loads():
    assert set(SHIPPED) <= set(profiles.available())
    for name in SHIPPED:
        profile = profiles.load_profile(name)
        assert profile.name == name
        assert profile.partitions
        assert profile.source == profiles.SHIPPED_DIR / f"{name}.toml"


def test_shipped_profiles_carry_the_sites_public_facts():
    edi = profiles.load_profile("edi")
    assert (edi.login.host, edi.node_scratch, edi.compute_internet) == (
        "mlp.inf.ed.ac.uk",
        "/disk/scratch",
        False,
    )
    assert edi.partition("PGR-Standard").max_time_s == 7 * 86400
    assert edi.partition("PGR-Standard").gpus_per_node is None  # not published, so not checked

    m3 = profiles.load_profile("m3")
    assert m3.account_required and m3.gpu_type_required
    assert m3.partition("desktop").qos == "desktopq"
    assert m3.partition("m3g").gpu_types == ("V100",)

    alliance = profiles.load_profile("alliance")
    assert alliance.gpu_request == "gpus-per-node"
    assert alliance.node_scratch_variable == "SLURM_TMPDIR"
    assert alliance.apptainer.setup == ("module load apptainer",)
    assert alliance.default_partition.implicit

    mila = profiles.load_profile("mila")
    assert (mila.login.host, mila.login.port) == ("login.server.mila.quebec", 2222)
    assert [p.name for p in mila.partitions] == ["unkillable", "main", "long"]
    assert mila.partition("long").preemptible
    # Mila's docs say neither whether its Slurm sends a job's --signal before preempting it nor the grace.
    assert mila.preemption == profiles.Preemption(send_user_signal=None, grace_time_s=None)

    assert alliance.max_mig_slices == 1
    assert {"v100l", "a100_3g.20gb"} <= set(alliance.default_partition.gpu_types)

    carc = profiles.load_profile("carc")
    assert carc.apptainer.setup[0] == "module purge"
    assert not carc.gpu_type_required and carc.partition("gpu").default_gpu_type is None

    dtu = profiles.load_profile("dtu")
    assert (dtu.scheduler, dtu.place, dtu.gpu_request, dtu.login.host) == (
        "lsf",
        "queue",
        "gpu",
        "login1.hpc.dtu.dk",
    )
    assert [q.name for q in dtu.partitions] == ["hpc", "gpuv100", "gpua100", "gpua40"]
    assert dtu.default_partition.name == "hpc" and dtu.partition("hpc").max_time_s is None  # not published
    assert dtu.partition("gpua100").max_time_s == 86400
    assert dtu.compute_internet is None

    local = profiles.load_profile("local")
    assert local.scheduler == "slurm" and local.place == "partition"
    assert local.default_partition.name == "cpu"
    assert local.partition("gpu").gpus_per_node == 2
    assert (local.login.port, local.login.user) == (2222, "researcher")


def test_user_profile_shadows_the_shipped_one(user_dir: Path):
    (user_dir / "edi.toml").write_text(MINIMAL)
    profile = profiles.load_profile("edi")
    assert profile.login.host == "login.example.org"
    assert profile.source == user_dir / "edi.toml"


def test_user_profile_adds_a_cluster(user_dir: Path):
    (user_dir / "mysite.toml").write_text(MINIMAL)
    assert profiles.available()["mysite"] == user_dir / "mysite.toml"
    partition = profiles.load_profile("mysite").partition("gpu")
    assert (partition.max_time_s, partition.gpus_per_node, partition.gpu_types, partition.cpus_per_gpu) == (
        86400, 4, ("a100",), 8,
    )  # fmt: skip


def test_xdg_config_home_is_the_default_user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("HPCBOX_CLUSTERS_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert profiles.profile_dirs() == [tmp_path / "hpcbox" / "clusters", profiles.SHIPPED_DIR]


def test_a_projects_own_profiles_sit_between_the_users_and_the_shipped_ones(
    user_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    project = tmp_path / "group-project"
    (project / "slurm/clusters").mkdir(parents=True)
    (project / "pyproject.toml").write_text("[tool.hpcbox]\n")
    (project / "slurm/clusters/groupsite.toml").write_text(MINIMAL)
    (project / "slurm/clusters/edi.toml").write_text(MINIMAL.replace("login.example.org", "edi.group.org"))
    (project / "src").mkdir()
    monkeypatch.chdir(project / "src")  # anywhere in the project, as load_project finds it
    assert profiles.profile_dirs() == [user_dir, project / "slurm/clusters", profiles.SHIPPED_DIR]
    assert profiles.load_profile("groupsite").source == project / "slurm/clusters/groupsite.toml"
    assert profiles.load_profile("edi").login.host == "edi.group.org"  # the group's edi over hpcbox's
    (user_dir / "edi.toml").write_text(MINIMAL)
    assert profiles.load_profile("edi").login.host == "login.example.org"  # and the user's over both
    monkeypatch.chdir(tmp_path)
    assert "groupsite" not in profiles.available()


def test_unknown_cluster_lists_the_known_ones():
    with pytest.raises(FieldError) as caught:
        profiles.load_profile("nowhere")
    assert caught.value.field == "cluster"
    assert "edi" in caught.value.message and "mila" in caught.value.message


def _error_for(user_dir: Path, text: str) -> FieldError:
    (user_dir / "broken.toml").write_text(text)
    with pytest.raises(FieldError) as caught:
        profiles.load_profile("broken")
    assert str(user_dir / "broken.toml") in caught.value.message
    return caught.value


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (('request = "gres"', 'request = "gpus"'), "gpus.request"),
        (('node_scratch = "/tmp"', 'node_scratch = "scratch"'), "storage.node_scratch"),
        (('max_time = "1-00:00:00"', 'max_time = "a day"'), "partitions[0].max_time"),
        (('max_time = "1-00:00:00"', 'max_time = "0:00"'), "partitions[0].max_time"),
        (("gpus_per_node = 4", 'gpus_per_node = "4"'), "partitions[0].gpus_per_node"),
        (("cpus_per_gpu = 8\n", ""), "partitions[0].cpus_per_gpu"),  # neither given nor marked unknown
        (('host = "login.example.org"', 'hostname = "x"'), "login.host"),
        (("compute_internet = false", "compute_internet = false\nnode_scratch = '/x'"), "node_scratch"),
        (("[login]", "[preemption]\nsend_user_signal = 'yes'\n[login]"), "preemption.send_user_signal"),
        (("[login]", "[preemption]\ngrace_time_s = -1\n[login]"), "preemption.grace_time_s"),
        (("[login]", "[preemption]\ngrace_time = 30\n[login]"), "preemption.grace_time"),
    ],
)
def test_profile_mistakes_name_the_key(user_dir: Path, change: tuple[str, str], field: str):
    assert change[0] in MINIMAL
    error = _error_for(user_dir, MINIMAL.replace(*change))
    assert error.field == field


@pytest.mark.parametrize("spelling", ["UNLIMITED", "unlimited", "INFINITE", "infinite", "Infinite"])
def test_a_partition_without_a_time_limit(user_dir: Path, spelling: str):
    (user_dir / "site.toml").write_text(
        MINIMAL.replace('max_time = "1-00:00:00"', f'max_time = "{spelling}"')
    )
    assert profiles.load_profile("site").partition("gpu").max_time_s is None


def test_a_default_gpu_type_needs_a_site_that_requires_types(user_dir: Path):
    error = _error_for(user_dir, MINIMAL + 'default_gpu_type = "a100"\n')
    assert error.field == "partitions[0].default_gpu_type"
    assert "a request without one stays untyped" in error.message
    (user_dir / "typed.toml").write_text(
        MINIMAL.replace('request = "gres"', 'request = "gres"\ntype_required = true')
        + 'default_gpu_type = "a100"\n'
    )
    assert profiles.load_profile("typed").partition("gpu").default_gpu_type == "a100"


def test_a_fact_both_given_and_marked_unknown_is_rejected(user_dir: Path):
    error = _error_for(user_dir, MINIMAL + 'unknown = ["max_time"]\n')
    assert error.field == "partitions[0].max_time"


def test_bind_over_the_job_scratch_mount_is_rejected(user_dir: Path):
    error = _error_for(user_dir, MINIMAL + '[apptainer]\nbinds = ["/scratch"]\n')
    assert error.field == "apptainer.binds"
    assert "/scratch" in error.message


def test_invalid_toml_says_so(user_dir: Path):
    (user_dir / "broken.toml").write_text("[login\n")
    with pytest.raises(HpcboxError, match="not valid TOML"):
        profiles.load_profile("broken")


def test_shipped_files_mark_what_they_do_not_know():
    """Unknowns are written down in the file rather than guessed."""
    for name in SHIPPED:
        data = tomllib.loads((profiles.SHIPPED_DIR / f"{name}.toml").read_text())
        for partition in data.get("partitions") or data["queues"]:
            for fact in ("max_time", "gpus_per_node", "gpu_types", "cpus_per_gpu"):
                assert (fact in partition) != (fact in partition.get("unknown", [])), (name, fact)


LSF_MINIMAL = """
scheduler = "lsf"
compute_internet = false
[login]
host = "login.example.org"
[gpus]
request = "gpu"
[storage]
node_scratch = "/tmp"
[[queues]]
name = "gpuq"
max_time = "24:00:00"
gpus_per_node = 2
unknown = ["gpu_types", "cpus_per_gpu"]
"""


def test_an_lsf_profile_lists_queues_read_as_partitions(user_dir: Path):
    (user_dir / "lsfsite.toml").write_text(LSF_MINIMAL)
    profile = profiles.load_profile("lsfsite")
    assert profile.lsf and profile.place == "queue"
    assert profile.partition("gpuq").max_time_s == 86400
    with pytest.raises(FieldError, match="'cpu' is not a queue of cluster 'lsfsite'"):
        profile.partition("cpu")


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        (('scheduler = "lsf"', 'scheduler = "pbs"'), "scheduler", "'pbs' (allowed: slurm, lsf)"),
        (('request = "gpu"', 'request = "gres"'), "gpus.request", "'gres' (allowed: gpu)"),
        (
            ("[[queues]]", "[[partitions]]"),
            "partitions",
            "scheduler = 'lsf' lists [[queues]], not [[partitions]]",
        ),
        (('request = "gpu"', 'request = "gpu"\ntype_required = true'), "gpus.type_required", "Slurm setting"),
        (('name = "gpuq"', 'name = "gpuq"\nqos = "normal"'), "queues[0].qos", "LSF has no QOS"),
        (('max_time = "24:00:00"', 'max_time = "a day"'), "queues[0].max_time", "not a Slurm time"),
        (('request = "gpu"', 'request = "gpu"\n[preemption]\ngrace_time_s = 60'), "preemption", "Slurm's"),
    ],
)
def test_lsf_profile_mistakes_name_the_key(user_dir: Path, change: tuple[str, str], field: str, says: str):
    assert change[0] in LSF_MINIMAL
    error = _error_for(user_dir, LSF_MINIMAL.replace(*change))
    assert error.field == field
    assert says in error.message


def test_a_slurm_profile_lists_partitions_not_queues(user_dir: Path):
    error = _error_for(user_dir, MINIMAL.replace("[[partitions]]", "[[queues]]"))
    assert error.field == "queues"


def test_a_site_can_ask_for_the_sif_on_node_scratch(user_dir: Path):
    (user_dir / "slowfs.toml").write_text(MINIMAL + "[apptainer]\nsif_on_scratch = true\n")
    assert profiles.load_profile("slowfs").apptainer.sif_on_scratch is True
    assert profiles.load_profile("edi").apptainer.sif_on_scratch is False  # left out: read where shipped
    error = _error_for(user_dir, MINIMAL + "[apptainer]\nsif_on_scratch = 'yes'\n")
    assert error.field == "apptainer.sif_on_scratch"


def test_a_profile_that_lists_the_sites_accounts_refuses_others_and_one_that_does_not_takes_any():
    from hpcbox.render.resources import ResourceRequest, resolve

    listed = profiles.parse_profile(
        tomllib.loads(MINIMAL + '[accounting]\naccounts = ["vf68", "ml-lab"]\n'), name="group"
    )
    assert resolve(listed, ResourceRequest(job_name="fit", account="vf68")).account == "vf68"
    with pytest.raises(FieldError) as refused:
        resolve(listed, ResourceRequest(job_name="fit", account="someone-else"))
    assert refused.value.message == (
        "account: 'someone-else' is not one of cluster 'group''s accounts (allowed: vf68, ml-lab)"
    )
    open_ended = profiles.parse_profile(tomllib.loads(MINIMAL), name="site")
    assert open_ended.accounts is None
    assert resolve(open_ended, ResourceRequest(job_name="fit", account="anything_1")).account == "anything_1"


def test_what_a_profile_assumes_is_named_in_its_job_scripts_and_its_rehearsal():
    from hpcbox.minicluster.shape import shape_of
    from hpcbox.render.resources import ResourceRequest, resolve
    from hpcbox.render.sbatch import JobInputs, render_sbatch

    carc = profiles.load_profile("carc")
    assert carc.assumed == (("storage.node_scratch", '"/tmp"'), ("accounting.account_required", "true"))
    line = (
        "assumed for carc, not published by the site (check them there): "
        'storage.node_scratch = "/tmp"; accounting.account_required = true'
    )
    assert profiles.assumptions(carc) == line
    checked = resolve(carc, ResourceRequest(job_name="j", account="a_1"))
    assert f"\n# {line}\n" in render_sbatch(carc, checked, JobInputs.defaults("trainer")).text
    assert f"  {line}" in shape_of(carc).describe()
    # Where nothing is assumed, nothing is said.
    assert (
        profiles.load_profile("alliance").assumed == ()
        and profiles.assumptions(profiles.load_profile("local")) == ""
    )


def test_an_assumed_setting_must_be_one_the_profile_gives(user_dir: Path):
    assert profiles.parse_profile(
        tomllib.loads('assumed = ["storage.node_scratch"]\n' + MINIMAL), name="site"
    ).assumed == (("storage.node_scratch", '"/tmp"'),)
    error = _error_for(user_dir, 'assumed = ["storage.scratch_dir"]\n' + MINIMAL)
    assert (
        error.field == "assumed"
        and "'storage.scratch_dir' is not a setting this profile gives" in error.message
    )


def test_whether_nodes_have_fuse_is_known_either_way_or_left_out(user_dir: Path):
    for value, fuse in (("true", True), ("false", False)):
        site = profiles.parse_profile(tomllib.loads(MINIMAL + f"[apptainer]\nfuse = {value}\n"), name="site")
        assert site.apptainer.fuse is fuse
    assert profiles.load_profile("edi").apptainer.fuse is None  # not published: each job finds out
    assert _error_for(user_dir, MINIMAL + "[apptainer]\nfuse = 'yes'\n").field == "apptainer.fuse"


def test_a_store_is_private_unless_the_profile_shares_it_with_a_group(user_dir: Path):
    assert profiles.load_profile("edi").store == profiles.StoreSettings(group=None)
    (user_dir / "shared.toml").write_text(MINIMAL + '[store]\ngroup = "hpc-users_1"\n')
    assert profiles.load_profile("shared").store.group == "hpc-users_1"


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ('[store]\ngroup = "-R"\n', "store.group"),  # would be an option of chgrp's
        ('[store]\ngroup = "1500"\n', "store.group"),  # a gid, not a name
        ('[store]\ngroup = "hpc users"\n', "store.group"),
        ("[store]\ngroup = 1500\n", "store.group"),
        ('[store]\nmode = "0750"\n', "store.mode"),
    ],
)
def test_a_store_group_must_be_a_group_name(user_dir: Path, table: str, field: str):
    error = _error_for(user_dir, MINIMAL + table)
    assert error.field == field and "\n" not in error.message


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        (
            ('host = "login.example.org"', 'host = "-oProxyCommand=touch /tmp/x"'),
            "login.host",
            "begins with '-'",
        ),
        (
            ('host = "login.example.org"', 'host = "login.example.org"\nuser = "-lroot"'),
            "login.user",
            "begins",
        ),
        (('host = "login.example.org"', 'host = "login example.org"'), "login.host", "contains spaces"),
    ],
)
def test_a_login_that_ssh_would_read_as_an_option_is_refused(
    user_dir: Path, change: tuple[str, str], field: str, says: str
):
    error = _error_for(user_dir, MINIMAL.replace(*change))
    assert error.field == field and says in error.message


def test_an_unknown_partition_is_added_to_a_copy_of_a_shipped_profile_not_to_the_installed_file(
    tmp_path, monkeypatch
):
    """Issue 59: the hint said to edit the installed package's edi.toml, which an upgrade replaces."""
    monkeypatch.setenv("HPCBOX_CLUSTERS_DIR", str(tmp_path))
    with pytest.raises(FieldError) as shipped:
        profiles.load_profile("edi").partition("nope")
    assert shipped.value.hint.endswith(f"in {tmp_path}/ (a profile there shadows the shipped one)")
    assert "a copy of " in shipped.value.hint and "edi.toml" in shipped.value.hint
    (tmp_path / "edi.toml").write_text((profiles.SHIPPED_DIR / "edi.toml").read_text())
    with pytest.raises(FieldError) as own:
        profiles.load_profile("edi").partition("nope")
    assert own.value.hint == f"pick one of them, or add it to {tmp_path / 'edi.toml'}"
