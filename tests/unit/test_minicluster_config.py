"""Mini cluster settings, the Slurm files rendered from them, and the SSH options pinned to a host key."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from hpcbox.errors import HpcboxError
from hpcbox.minicluster import slurmconf
from hpcbox.minicluster.shape import RULES, ClusterShape, shape_like, shape_of
from hpcbox.minicluster.spec import ClusterSpec
from hpcbox.minicluster.spec import spec_like as minicluster_spec
from hpcbox.render import profiles
from hpcbox.tools import ssh


def conf_values(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and " " not in line)


def test_slurm_conf_names_nodes_partitions_and_gpus():
    spec = ClusterSpec(name="demo-one", nodes=3, gpus_per_node=2)
    text = slurmconf.slurm_conf(spec, shape_like("local"))
    values = conf_values(text)
    assert values["ClusterName"] == "demo_one"
    assert values["GresTypes"] == "gpu"
    assert values["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert int(values["SlurmdTimeout"]) <= 30
    assert "NodeName=node1,node2,node3 CPUs=2 RealMemory=2000 Gres=gpu:2 State=UNKNOWN" in text
    # cpu and gpu are never preempted: the tier above the preemptible partition's (below).
    assert (
        "PartitionName=cpu Nodes=node1,node2,node3 Default=YES MaxTime=INFINITE PriorityTier=2 "
        "PreemptMode=OFF State=UP" in text
    )
    assert (
        "PartitionName=gpu Nodes=node1,node2,node3 MaxTime=INFINITE PriorityTier=2 PreemptMode=OFF State=UP"
        in text
    )
    # The local mini cluster enforces no accounts and sets no per-job scratch; it enforces a job's
    # CPUs, memory and GPU devices with cgroups, and its task prolog tells jobs that its GPUs are
    # placeholders.
    assert not {"AccountingStorageEnforce", "JobSubmitPlugins", "Prolog", "Epilog"} & set(values)
    assert (values["ProctrackType"], values["TaskPlugin"]) == (
        "proctrack/cgroup",
        "task/cgroup,task/affinity",
    )
    assert "JobAcctGatherParams" not in values  # no accounting kill beside the cgroup's
    assert values["TaskProlog"].endswith("/task-prolog.sh")


def test_cgroups_constrain_memory_cores_and_gpu_devices_in_the_nodes_own_v1_tree():
    shape = shape_like("local")
    files = slurmconf.config_files(ClusterSpec(), shape)
    assert conf_values(files["cgroup.conf"][0].decode()) == {
        "CgroupPlugin": "cgroup/v1",
        "ConstrainCores": "yes",
        "ConstrainRAMSpace": "yes",
        "ConstrainDevices": "yes",
    }
    assert "HPCBOX_CGROUPS=1\n" in files["node.env"][0].decode()


def test_without_cgroups_slurms_accounting_enforces_memory_and_binding_the_cpus():
    shape = dataclasses.replace(shape_like("local"), cgroups=False)
    files = slurmconf.config_files(ClusterSpec(), shape)
    values = conf_values(files["slurm.conf"][0].decode())
    assert (values["ProctrackType"], values["TaskPlugin"]) == ("proctrack/linuxproc", "task/affinity")
    assert (values["JobAcctGatherType"], values["JobAcctGatherParams"]) == (
        "jobacct_gather/linux",
        "OverMemoryKill",
    )
    assert "cgroup.conf" not in files and "HPCBOX_CGROUPS=''\n" in files["node.env"][0].decode()
    assert ClusterShape.from_dict(json.loads(json.dumps(asdict(shape)))) == shape
    assert any(
        "memory by Slurm's accounting (over --mem: killed within a second, FAILED 0:9" in line
        for line in shape.describe()
    )


def test_on_cgroup_v2_slurmd_makes_its_own_tree_without_systemd_and_constrains_the_same():
    shape = dataclasses.replace(shape_like("local"), cgroup_version=2)
    files = slurmconf.config_files(ClusterSpec(), shape)
    assert conf_values(files["cgroup.conf"][0].decode()) == {
        "CgroupPlugin": "cgroup/v2",
        "IgnoreSystemd": "yes",
        "ConstrainCores": "yes",
        "ConstrainRAMSpace": "yes",
        "ConstrainDevices": "yes",
    }
    values = conf_values(files["slurm.conf"][0].decode())
    assert (values["ProctrackType"], values["TaskPlugin"]) == (
        "proctrack/cgroup",
        "task/cgroup,task/affinity",
    )
    assert "JobAcctGatherParams" not in values
    assert "HPCBOX_CGROUPS=2\n" in files["node.env"][0].decode()
    # Slurm 22.05 enables controllers in the cgroups it makes itself only with CgroupAutomount; later
    # ones always do (and 24.11 calls the option defunct).
    for version in ("22.05", "24.11", "26.05"):
        conf = slurmconf.config_files(ClusterSpec(slurm=version), shape)["cgroup.conf"][0].decode()
        assert ("CgroupAutomount" in conf_values(conf)) == (version == "22.05"), version
    assert ClusterShape.from_dict(json.loads(json.dumps(asdict(shape)))) == shape
    assert any(
        line.startswith("  enforced: CPUs, memory and GPU devices by cgroups (cgroup v2)")
        for line in shape.describe()
    )


def test_a_compute_node_gets_a_cgroup_tree_of_its_own_and_its_fake_gpus_only_with_cgroups():
    from hpcbox.minicluster import nodes

    for version in (1, 2):
        shape = dataclasses.replace(shape_like("local"), cgroup_version=version)
        with_cgroups = nodes.compute_options(shape)
        without = nodes.compute_options(dataclasses.replace(shape, cgroups=False))
        assert with_cgroups["cgroupns"] == "private" and "SYS_ADMIN" in with_cgroups["cap_add"]
        # On v2 Docker's filter lets the node open every fake GPU, and slurmd attaches its own filters.
        v2 = (
            {"device_cgroup_rules": ["c 120:* rwm"], "NET_ADMIN": True}
            if version == 2
            else {"NET_ADMIN": False}
        )
        assert {key: with_cgroups.get(key) for key in v2 if key != "NET_ADMIN"} == {
            key: value for key, value in v2.items() if key != "NET_ADMIN"
        }
        assert ("NET_ADMIN" in with_cgroups["cap_add"]) is v2["NET_ADMIN"]
        assert (
            not {"cgroupns", "device_cgroup_rules"} & set(without) and "SYS_ADMIN" not in without["cap_add"]
        )


@pytest.mark.parametrize(
    ("info", "asked", "cgroups", "version"),
    [
        ({"CgroupVersion": "1", "SecurityOptions": ["name=seccomp,profile=default"]}, None, True, 1),
        ({"CgroupVersion": "2", "SecurityOptions": ["name=seccomp,profile=default"]}, None, True, 2),
        ({"CgroupVersion": "2", "SecurityOptions": ["name=rootless"]}, None, False, 2),
        ({"CgroupVersion": "1", "SecurityOptions": ["name=rootless"]}, None, False, 1),
        ({}, None, False, 0),
        ({"CgroupVersion": "1"}, False, False, 1),
        ({"CgroupVersion": "2"}, False, False, 2),
    ],
)
def test_the_nodes_get_cgroups_where_the_engine_can_give_them(info, asked, cgroups, version):
    from hpcbox.minicluster import lifecycle

    found = lifecycle.EngineCgroups.from_info(info)
    assert (lifecycle.cgroups_for(asked, found), found.version) == (cgroups, version)


def test_a_rootless_engine_says_in_one_line_what_its_nodes_cannot_enforce():
    from hpcbox.minicluster import lifecycle

    found = lifecycle.EngineCgroups.from_info({"CgroupVersion": "2", "SecurityOptions": ["name=rootless"]})
    assert found.cannot == (
        "this Docker engine (rootless, cgroup v2) gives the compute nodes no cgroups of their own: Slurm's "
        "accounting enforces --mem (FAILED 0:9 within a second, where a cgroup site says OUT_OF_MEMORY), "
        "CPUs are bound but not confined, and a job can open every GPU device file"
    )
    with pytest.raises(HpcboxError) as caught:
        lifecycle.cgroups_for(True, found)
    assert caught.value.message.startswith("cgroups: this Docker engine (rootless, cgroup v2) cannot give")


@pytest.mark.parametrize(("gpus", "devices"), [(1, "/dev/fakegpu0"), (4, "/dev/fakegpu[0-3]")])
def test_gres_conf_gives_every_gpu_a_device_file(gpus, devices):
    expected = f"AutoDetect=off\nName=gpu File={devices}\n"
    assert slurmconf.gres_conf(ClusterSpec(like="carc"), shape_like("carc", gpus_per_node=gpus)) == expected


def test_a_cluster_shaped_like_edi_has_its_partition_and_time_limit():
    text = slurmconf.slurm_conf(ClusterSpec(like="edi"), shape_like("edi"))
    assert "PartitionName=PGR-Standard Nodes=node1,node2 Default=YES MaxTime=10080 State=UP" in text
    assert "PartitionName=cpu" not in text


def test_the_local_clusters_preemptible_partition_is_preempted_by_the_others_and_requeued():
    """Preemption by partition, as Slurm's own tests set it up: over the same nodes, a lower tier whose
    jobs are requeued after their grace time; the profile says whether the --signal goes first."""
    shape = shape_like("local")
    text = slurmconf.slurm_conf(ClusterSpec(nodes=1), shape)
    values = conf_values(text)
    assert (values["PreemptType"], values["PreemptMode"]) == ("preempt/partition_prio", "REQUEUE")
    assert "PreemptParameters" not in values  # local.toml: send_user_signal = false, Slurm's default
    assert (
        "PartitionName=preemptible Nodes=node1 MaxTime=INFINITE PriorityTier=1 PreemptMode=REQUEUE "
        "GraceTime=30 State=UP" in text
    )
    signalled = dataclasses.replace(shape, send_user_signal=True, grace_time_s=120)
    text = slurmconf.slurm_conf(ClusterSpec(nodes=1), signalled)
    assert conf_values(text)["PreemptParameters"] == "send_user_signal"
    assert "PreemptMode=REQUEUE GraceTime=120 State=UP" in text
    assert ClusterShape.from_dict(json.loads(json.dumps(asdict(signalled)))) == signalled
    assert (
        "  preemption: preemptible preempted by the other partitions' jobs on its nodes; a preempted job "
        "gets its --signal at once, then TERM, KILL 120 s later, and is requeued" in signalled.describe()
    )


def test_a_cluster_whose_profile_preempts_nothing_has_no_preemption_at_all():
    text = slurmconf.slurm_conf(ClusterSpec(like="edi"), shape_like("edi"))
    assert not any(word in text for word in ("Preempt", "PriorityTier", "GraceTime"))
    assert not any("preemption" in line for line in shape_like("edi").describe())


def test_a_site_whose_preemption_the_profile_does_not_describe_gets_generic_values_said_so():
    shape = shape_like("mila")
    assert [p.name for p in shape.partitions if p.preemptible] == ["long"]
    assert (shape.send_user_signal, shape.grace_time_s) == (False, 30)
    described = "\n".join(shape.describe())
    assert "whether a preempted job gets its --signal first (here: no, Slurm's default)" in described
    assert "a preempted job's grace time (here: 30 s)" in described
    text = slurmconf.slurm_conf(ClusterSpec(like="mila"), shape)
    assert "PartitionName=long Nodes=node1,node2 MaxTime=INFINITE PriorityTier=1 PreemptMode=REQUEUE" in text
    assert (
        "PartitionName=main Nodes=node1,node2 Default=YES MaxTime=INFINITE PriorityTier=2 PreemptMode=OFF"
        in text
    )


def test_a_preemption_the_profile_states_is_the_rehearsals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    shipped = profiles.load_profile("mila").source.read_text()
    (tmp_path / "mymila.toml").write_text(
        shipped + "\n[preemption]\nsend_user_signal = true\ngrace_time_s = 300\n"
    )
    monkeypatch.setenv("HPCBOX_CLUSTERS_DIR", str(tmp_path))
    shape = shape_like("mymila")
    assert (shape.send_user_signal, shape.grace_time_s) == (True, 300)
    assert not any("grace time" in fact or "--signal" in fact for fact in shape.generic)
    assert "GraceTime=300" in slurmconf.slurm_conf(ClusterSpec(like="mymila"), shape)


def test_typed_gpus_each_get_their_own_device_files():
    """A type a job added (v100) goes to the partitions whose types edi's profile leaves unknown; its A40
    partition keeps nodes with A40s alone."""
    shape = shape_like("edi").with_gpu_types(("v100",))
    assert shape.gpu_types == ("a40", "v100")
    spec = ClusterSpec(like="edi")
    text = slurmconf.slurm_conf(spec, shape)
    assert "NodeName=node1 CPUs=2 RealMemory=2000 Gres=gpu:a40:2,gpu:v100:2 " in text
    assert "NodeName=node2 CPUs=2 RealMemory=2000 Gres=gpu:a40:2 " in text
    assert "PartitionName=PGR-Standard-Noble Nodes=node2 " in text
    assert "PartitionName=PGR-Standard Nodes=node1 " in text
    assert slurmconf.gres_conf(spec, shape).splitlines()[1:] == [
        "NodeName=node1 Name=gpu Type=a40 File=/dev/fakegpu[0-1]",
        "NodeName=node1 Name=gpu Type=v100 File=/dev/fakegpu[2-3]",
        "NodeName=node2 Name=gpu Type=a40 File=/dev/fakegpu[0-1]",
    ]
    assert "HPCBOX_FAKE_GPUS=4\n" in slurmconf.node_env(shape)


def test_partitions_whose_gpu_types_are_known_have_nodes_of_their_own():
    """M3's partitions each hold one GPU model: a job on desktop gets a P4, as at the site, and an
    untyped request there is one for a P4 (what a profile drafted from the rehearsal reads back)."""
    shape = shape_like("m3")
    assert shape.gpu_types == ("V100", "P100", "P4")
    spec = minicluster_spec("m3")
    assert spec.nodes == 3
    text = slurmconf.slurm_conf(spec, shape)
    assert "NodeName=node1 CPUs=64 RealMemory=256000 Gres=gpu:V100:2 State=UNKNOWN" in text
    assert "NodeName=node3 CPUs=64 RealMemory=256000 Gres=gpu:P4:2 State=UNKNOWN" in text
    assert "PartitionName=desktop Nodes=node3 MaxTime=INFINITE AllowQos=desktopq State=UP" in text
    assert slurmconf.gres_conf(spec, shape).splitlines()[1:] == [
        "NodeName=node1 Name=gpu Type=V100 File=/dev/fakegpu[0-1]",
        "NodeName=node2 Name=gpu Type=P100 File=/dev/fakegpu[0-1]",
        "NodeName=node3 Name=gpu Type=P4 File=/dev/fakegpu[0-1]",
    ]
    assert "HPCBOX_FAKE_GPUS=2\n" in slurmconf.node_env(shape)
    six = slurmconf.node_groups(dataclasses.replace(spec, nodes=7), shape)
    assert [hosts for hosts, _, _ in six] == [
        ("node1", "node2", "node3"),
        ("node4", "node5"),
        ("node6", "node7"),
    ]
    with pytest.raises(HpcboxError) as caught:
        slurmconf.node_groups(dataclasses.replace(spec, nodes=2), shape)
    assert caught.value.message.startswith("nodes: a cluster shaped like m3 needs at least 3 compute nodes")
    assert "pass --nodes 3" in caught.value.hint


def stated(name: str) -> ClusterShape:
    """The shape of profile ``name`` as if its site stated the rules it only assumes."""
    profile = profiles.load_profile(name)
    kept = tuple((key, value) for key, value in profile.assumed if key not in RULES)
    return shape_of(dataclasses.replace(profile, assumed=kept))


def test_a_stated_gpu_type_rule_is_enforced_by_the_sites_filter():
    lua = slurmconf.job_submit_lua(stated("m3"))
    assert 'slurm.log_user("m3: name a GPU type, e.g. --gres=gpu:TYPE:N")' in lua
    assert "untyped_gpus(job_desc.tres_per_node)" in lua
    assert "untyped_gpus" not in slurmconf.job_submit_lua(stated("carc"))


def test_a_stated_account_rule_and_a_partition_qos_are_enforced_by_slurm():
    shape = stated("m3")
    values = conf_values(slurmconf.slurm_conf(ClusterSpec(like="m3", nodes=3), shape))
    assert values["AccountingStorageEnforce"] == "associations,limits,qos"
    assert values["JobSubmitPlugins"] == "lua"
    assert "PartitionName=desktop Nodes=node3 MaxTime=INFINITE AllowQos=desktopq State=UP" in (
        slurmconf.slurm_conf(ClusterSpec(like="m3", nodes=3), shape)
    )
    lua = slurmconf.job_submit_lua(shape)
    assert "job_desc.account == nil" in lua and "ESLURM_INVALID_ACCOUNT" in lua
    assert "HPCBOX_QOS=desktopq\n" in slurmconf.node_env(shape)
    assert "  account: required (a job without --account is refused)" in shape.describe()


@pytest.mark.parametrize("name", ["carc", "m3"])
def test_a_rule_the_profile_only_assumes_refuses_nothing_in_its_rehearsal(name: str):
    """carc's account rule and m3's account and GPU-type rules come from their docs' examples: the
    rehearsal has no filter for them, a job without an account goes to the user's default one, and an
    account the user is not in is still refused (associations)."""
    shape = shape_like(name)
    assert not (shape.account_required or shape.qos_required or shape.gpu_type_required)
    assert "accounting.account_required" in shape.assumed_rules
    files = slurmconf.config_files(ClusterSpec(like=name, nodes=3), shape)
    values = conf_values(files["slurm.conf"][0].decode())
    assert "job_submit.lua" not in files and "JobSubmitPlugins" not in values
    assert values["AccountingStorageEnforce"] == "associations,limits,qos"
    described = shape.describe()
    assert (
        "  account: your default one where a job names none (the profile only assumes one is required)"
        in (described)
    )
    typed = any(
        "a GPU request without a type takes any (the profile only assumes" in line for line in described
    )
    assert typed == (name == "m3")
    assert ClusterShape.from_dict(json.loads(json.dumps(asdict(shape)))) == shape


def test_scratch_named_by_a_variable_is_made_per_job_by_the_prolog():
    shape = shape_like("alliance")
    assert (shape.scratch_dir, shape.scratch_variable) == ("/localscratch", "SLURM_TMPDIR")
    values = conf_values(slurmconf.slurm_conf(ClusterSpec(like="alliance"), shape))
    assert values["TaskProlog"].endswith("/task-prolog.sh") and values["Epilog"].endswith("/epilog.sh")
    env = slurmconf.node_env(shape)
    assert "HPCBOX_SCRATCH_VARIABLE=SLURM_TMPDIR\n" in env
    # The site areas its binds name exist on the nodes; `module load apptainer` has a stub to call.
    assert "HPCBOX_SITE_AREAS='/project /scratch'\n" in env and "HPCBOX_MODULE_STUB=1\n" in env


def test_status_says_what_the_profile_leaves_unknown():
    described = "\n".join(shape_like("edi").describe())
    assert "shaped like profile 'edi'" in described
    assert "PGR-Standard: gpus_per_node, gpu_types, cpus_per_gpu" in described


def test_a_saved_shape_reads_back_equal():
    shape = shape_like("m3")
    assert ClusterShape.from_dict(json.loads(json.dumps(asdict(shape)))) == shape


@pytest.mark.parametrize(
    ("like", "problem"),
    [("nowhere", "like: no profile named 'nowhere'"), ("../edi", "like: no profile named '../edi'")],
)
def test_an_unknown_profile_to_shape_like_names_the_flag(like, problem):
    with pytest.raises(HpcboxError) as caught:
        shape_like(like)
    assert caught.value.message.startswith(problem)


def test_slurmdbd_conf_carries_the_generated_password():
    values = conf_values(slurmconf.slurmdbd_conf(ClusterSpec(), "s3cret"))
    assert values["StoragePass"] == "s3cret"
    assert values["DbdHost"] == "accounting"


@pytest.mark.parametrize(
    ("field", "value"),
    [("name", "Bad_Name"), ("name", "x"), ("nodes", 0), ("nodes", 17), ("port", 22), ("gpus_per_node", 0)],
)
def test_invalid_settings_name_the_field(field, value):
    with pytest.raises(HpcboxError) as caught:
        ClusterSpec(**{field: value})
    assert caught.value.message.startswith(f"{field}:")


def test_ssh_pins_the_host_key_and_uses_only_the_given_key(tmp_path: Path):
    target = ssh.Target("127.0.0.1", 2222, "researcher", tmp_path / "id", tmp_path / "known_hosts")
    argv = ssh.ssh_argv(target, ["echo", "a b"])
    assert "StrictHostKeyChecking=yes" in argv
    assert f"UserKnownHostsFile={tmp_path / 'known_hosts'}" in argv
    assert f"IdentityFile={tmp_path / 'id'}" in argv
    assert argv[-3:] == ["-T", "127.0.0.1", "echo 'a b'"]
    assert "Port=2222" in argv and "User=researcher" in argv and "BatchMode=yes" in argv


def test_keygen_and_known_hosts_line(tmp_path: Path):
    public = ssh.keygen(tmp_path / "key", "test@here")
    assert public.startswith("ssh-ed25519 ") and public.endswith("test@here")
    assert (tmp_path / "key").stat().st_mode & 0o777 == 0o600
    line = ssh.known_hosts_line("127.0.0.1", 2222, public)
    assert line == "[127.0.0.1]:2222 " + " ".join(public.split()[:2])
    with pytest.raises(HpcboxError, match="refusing to overwrite"):
        ssh.keygen(tmp_path / "key", "again")


def test_loading_the_node_classes_switches_the_testcontainers_reaper_off():
    # Ryuk is an image from a registry; pulling it would fail here, and `down` cleans up instead.
    from testcontainers.core.config import testcontainers_config

    from hpcbox.minicluster import nodes

    assert testcontainers_config.ryuk_disabled is True
    assert {host: nodes.node_class(host).role for host in ClusterSpec(nodes=2).hosts} == {
        "accounting": "accounting",
        "controller": "controller",
        "node1": "compute",
        "node2": "compute",
        "login": "login",
    }


def test_a_gpu_type_added_to_a_shape_whose_profile_leaves_types_unknown():
    # carc's profile publishes no GPU types: its rehearsal has untyped gres until a job names a type.
    untyped = shape_like("carc", gpus_per_node=2)
    assert untyped.gpu_types == ()
    grown = untyped.with_gpu_types(("v100",))
    assert (grown.gpu_types, grown.gpus_per_node) == (("v100",), 2)
    assert grown.with_gpu_types(("v100",)) == grown  # once
    both = grown.with_gpu_types(("a100", "v100"))
    assert (both.gpu_types, both.gpus_per_node) == (("v100", "a100"), 4)
    spec = ClusterSpec(name="rehearsal", like="carc", added_gpu_types=("v100", "a100"))
    assert "Gres=gpu:v100:2,gpu:a100:2" in slurmconf.slurm_conf(spec, both)
    assert slurmconf.gres_conf(spec, both).splitlines()[1:] == [
        "Name=gpu Type=v100 File=/dev/fakegpu[0-1]",
        "Name=gpu Type=a100 File=/dev/fakegpu[2-3]",
    ]
    # As cluster.json keeps it (a list), read back equal to the spec that wrote it.
    assert ClusterSpec(**json.loads(json.dumps(asdict(spec)))) == spec
    with pytest.raises(HpcboxError, match="added_gpu_types: 'v100;rm' is not a Slurm GPU type name"):
        ClusterSpec(name="rehearsal", added_gpu_types=("v100;rm",))


@pytest.mark.parametrize(
    ("line", "usable", "held", "said"),
    [
        ("idle|none", True, False, "IDLE"),
        # Busy with the user's jobs is as up as idle (issue 58: `up` waited for them to end).
        ("mixed|none", True, False, "MIXED"),
        ("allocated|none", True, False, "ALLOCATED"),
        ("completing|none", True, False, "COMPLETING"),
        ("planned|none", True, False, "PLANNED"),
        ("idle-|none", True, False, "IDLE- (planned for a pending job)"),
        ("down*|Not responding", False, False, "DOWN* (not responding)"),
        ("idle*|none", False, False, "IDLE* (not responding)"),
        ("unknown*|none", False, False, "UNKNOWN* (not responding)"),
        ("idle~|none", False, False, "IDLE~ (powered off)"),
        ("down|Node unexpectedly rebooted", False, False, "DOWN (reason: Node unexpectedly rebooted)"),
        ("drained|Kill task failed", False, True, "DRAINED (reason: Kill task failed)"),
        ("draining|hpcbox test", False, True, "DRAINING (reason: hpcbox test)"),
        ("inval|gres/gpu count too low", False, False, "INVAL (reason: gres/gpu count too low)"),
    ],
)
def test_a_compute_node_is_up_in_every_state_that_takes_jobs_and_said_by_state_otherwise(
    line: str, usable: bool, held: bool, said: str
):
    from hpcbox.minicluster.nodes import NodeState

    state = NodeState.parse(line)
    assert (state.usable, state.held, str(state)) == (usable, held, said)
