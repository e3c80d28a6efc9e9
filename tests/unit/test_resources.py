"""Resource requests: parsing Slurm's units, and every validation rule naming its field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hpcbox.render import profiles
from hpcbox.render.resources import (
    DEFAULT_MAX_RESTARTS,
    MAX_RESTARTS_LIMIT,
    ContainerOptions,
    FieldError,
    ResourceRequest,
    format_time,
    parse_mem,
    parse_time,
    project_defaults,
    request_for,
    resolve,
)
from hpcbox.render.sbatch import gpu_option

PROFILE_TOML = """
compute_internet = false
[login]
host = "login.example.org"
[gpus]
request = "gres"
[accounting]
account_required = true
account_hint = "def-<PI>"
[storage]
node_scratch = "$SLURM_TMPDIR"
[[partitions]]
name = "gpu"
default = true
max_time = "1-00:00:00"
gpus_per_node = 4
gpu_types = ["a100", "v100"]
cpus_per_gpu = 8
[[partitions]]
name = "cpu"
max_time = "2:00:00"
gpus_per_node = 0
gpu_types = []
unknown = ["cpus_per_gpu"]
"""


@pytest.fixture
def site() -> profiles.ClusterProfile:
    import tomllib

    return profiles.parse_profile(tomllib.loads(PROFILE_TOML), name="site")


def _ok(**given) -> ResourceRequest:
    return ResourceRequest(job_name="train", account="def-smith", **given)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 1800),
        ("30:15", 1815),
        ("1:00:00", 3600),
        ("2-12", 2 * 86400 + 12 * 3600),
        ("2-12:30", 2 * 86400 + 12 * 3600 + 1800),
        ("7-00:00:00", 7 * 86400),
    ],
)
def test_parse_time_reads_every_slurm_form(text: str, seconds: int):
    assert parse_time(text) == seconds


def test_format_time_round_trips():
    for seconds in (59, 3600, 86399, 7 * 86400 + 5):
        assert parse_time(format_time(seconds)) == seconds


@pytest.mark.parametrize("text", ["1h", "1:00:00:00", "-1", "", "1.5", "one-hour"])
def test_malformed_time_names_the_field(site, text: str):
    with pytest.raises(FieldError) as caught:
        resolve(site, _ok(time=text))
    assert caught.value.field == "time"
    assert "H:M:S" in caught.value.message


@pytest.mark.parametrize("text", ["0", "00", "0:00", "0:0:0", "00:00:00", "0-0", "0-00:00:00"])
def test_a_time_of_zero_is_refused_rather_than_dropped(site, text: str):
    """sbatch reads --time=0 as no limit at all: zero is refused, never rendered nor left out."""
    error = _field_of(site, _ok(time=text))
    assert error.field == "time"
    assert error.message == (
        f"time: {text!r} is zero, which Slurm reads as no limit (allowed: a positive time, e.g. 1:30:00)"
    )


@pytest.mark.parametrize(
    ("text", "normal"), [("16G", "16G"), ("500m", "500M"), ("2gb", "2G"), ("1T", "1T"), ("0", "0M")]
)
def test_parse_mem_normalises(text: str, normal: str):
    assert parse_mem(text) == normal


def test_a_memory_size_without_a_unit_is_refused_saying_what_slurm_would_read(site):
    """Issue 59: `--mem 16` on a 2-GPU job became --mem=16M without a word (0, the whole node, stays)."""
    error = _field_of(site, _ok(mem="16"))
    assert (error.field, error.message) == (
        "mem",
        "mem: '16' has no unit, which Slurm reads as megabytes (16M)",
    )
    assert error.hint == "write 16M if that is what you mean, or 16G"


@pytest.mark.parametrize("text", ["16 GB", "sixteen", "1.5G", "16X", "-4G"])
def test_malformed_mem_names_the_field(site, text: str):
    with pytest.raises(FieldError) as caught:
        resolve(site, _ok(mem=text))
    assert caught.value.field == "mem"
    assert "16G" in caught.value.message


def _field_of(site, request: ResourceRequest) -> FieldError:
    with pytest.raises(FieldError) as caught:
        resolve(site, request)
    return caught.value


def test_unknown_partition_lists_the_allowed_ones(site):
    error = _field_of(site, _ok(partition="gpu-large"))
    assert error.field == "partition"
    assert "gpu, cpu" in error.message


def test_gpu_type_the_partition_lacks(site):
    error = _field_of(site, _ok(gpus=1, gpu_type="h100"))
    assert error.field == "gpu_type"
    assert "a100, v100" in error.message


def test_gpu_type_without_gpus(site):
    assert _field_of(site, _ok(gpu_type="a100")).field == "gpu_type"


def test_more_gpus_than_a_node_has(site):
    error = _field_of(site, _ok(gpus=5))
    assert error.field == "gpus"
    assert "0-4" in error.message


def test_gpus_on_a_partition_without_gpus(site):
    error = _field_of(site, _ok(partition="cpu", gpus=1))
    assert error.field == "gpus"
    assert "0-0" in error.message


def test_time_above_the_partition_limit(site):
    error = _field_of(site, _ok(partition="cpu", time="3:00:00"))
    assert error.field == "time"
    assert "02:00:00" in error.message


def test_cpus_per_gpu_above_the_site_limit(site):
    error = _field_of(site, _ok(gpus=2, cpus=9, ntasks_per_node=2))
    assert error.field == "cpus"
    assert "up to 8 CPUs per task" in error.message
    assert resolve(site, _ok(gpus=2, cpus=8, ntasks_per_node=2)).cpus_per_task == 8


def test_ddp_processes_default_to_the_gpus_per_node(site):
    assert resolve(site, _ok(gpus=2)).ntasks_per_node == 2
    assert resolve(site, _ok(gpus=2, ntasks_per_node=2, nodes=2)).tasks == 4
    assert resolve(site, _ok()).ntasks_per_node == 1
    assert resolve(site, _ok(ntasks_per_node=4)).ntasks_per_node == 4  # CPU-only DDP (gloo): as asked


@pytest.mark.parametrize(("gpus", "ntasks"), [(1, 6), (2, 1), (4, 2)])
def test_ddp_processes_that_do_not_match_the_gpus_are_refused(site, gpus: int, ntasks: int):
    error = _field_of(site, _ok(gpus=gpus, ntasks_per_node=ntasks))
    assert error.field == "ntasks_per_node"
    assert error.message == (
        f"ntasks_per_node: {ntasks} DDP processes per node on {gpus} GPU{'s' if gpus > 1 else ''} per node: "
        f"each process needs a GPU of its own (allowed: {gpus}, or leave it out)"
    )
    assert 'launcher = "srun"' in error.hint


def test_a_plain_task_count_is_honoured_when_the_job_is_not_ddp(site):
    assert resolve(site, _ok(gpus=1, ntasks_per_node=6), ddp=False).ntasks_per_node == 6
    assert resolve(site, _ok(gpus=2), ddp=False).ntasks_per_node == 1  # one process with both GPUs


def test_missing_required_account(site):
    error = _field_of(site, ResourceRequest(job_name="train"))
    assert error.field == "account"
    assert "def-<PI>" in error.message


@pytest.mark.parametrize(
    ("rule", "changed", "request_", "field"),
    [
        ("accounting.account_required", {}, {}, "account"),
        ("accounting.qos_required", {"qos_required": True}, {}, "qos"),
        ("gpus.type_required", {"gpu_type_required": True},
         {"gpus": 1, "partition": "gpu", "time": "1:00:00", "mem": "8G", "cpus": 4}, "gpu_type"),
    ],
)  # fmt: skip
def test_a_rule_the_profile_marks_assumed_warns_and_lets_the_job_through(
    site, rule, changed, request_, field
):
    """A rule typed from a site's docs but not verified must never refuse a job the site would run: the
    same request that a stated rule refuses goes through with one line saying what the site decides."""
    if rule != "accounting.account_required":
        changed = {**changed, "account_required": False}
    stated = dataclasses.replace(site, **changed)
    refused = _field_of(stated, ResourceRequest(job_name="train", **request_))
    assert refused.field == field
    assumed = dataclasses.replace(stated, assumed=(*stated.assumed, (rule, "true")))
    checked = resolve(assumed, ResourceRequest(job_name="train", **request_))
    assert len(checked.unverified) == 1, checked.unverified
    line = checked.unverified[0]
    assert line.startswith(refused.message.split(" (allowed: ")[0]), (line, refused.message)
    assert f"({rule} is under `assumed`: the site does not publish it)" in line
    assert "\n" not in line and "the site's sbatch decides" in line
    goes = "to your default account" if field == "account" else "as it is"
    assert f"; the job goes {goes}, and" in line
    met = {"account": "x", "qos": "q", **({"gpu_type": "a100"} if "gpus" in request_ else {})}
    assert resolve(stated, ResourceRequest(job_name="train", **met, **request_)).unverified == ()


def test_the_shipped_profiles_refuse_on_no_rule_they_only_assume():
    """m3's account and GPU type and carc's account come from their docs' examples, not a stated rule."""
    for name, rules in {"m3": ("accounting.account_required", "gpus.type_required"),
                        "carc": ("accounting.account_required",)}.items():  # fmt: skip
        profile = profiles.load_profile(name)
        assert set(rules) <= set(dict(profile.assumed)), name
        # A job without an account: one line, not a refusal.
        [line] = resolve(profile, ResourceRequest(job_name="train")).unverified
        assert line.startswith("account:") and "goes to your default account" in line, (name, line)
        # A GPU job on each partition whose models the profile lists (m3's, one each; carc's lists none):
        # the one model fills the type in, and the account is still the one assumed rule.
        for partition in (p.name for p in profile.partitions if p.gpu_types):
            checked = resolve(profile, ResourceRequest(job_name="train", gpus=1, partition=partition))
            assumed = [line for line in checked.unverified if "is under `assumed`" in line]
            assert [line.split(":")[0] for line in assumed] == ["account"], (name, partition)


def test_required_gpu_type_is_asked_for():
    # A site of several models that requires one (none of the shipped profiles: M3's partitions have
    # one model each, which fills in).
    alliance = profiles.load_profile("alliance")
    profile = dataclasses.replace(alliance, gpu_type_required=True)
    error = _field_of(profile, _ok(gpus=1))
    assert error.field == "gpu_type"
    assert "h100, a100, v100l" in error.message


def test_the_alliance_takes_gpus_without_a_model_as_its_docs_say():
    alliance = profiles.load_profile("alliance")
    untyped = resolve(alliance, _ok(gpus=1))
    assert untyped.gpus == 1 and untyped.gpu_type is None
    assert gpu_option(alliance, untyped) == "--gpus-per-node=1"
    assert gpu_option(alliance, resolve(alliance, _ok(gpus=1, gpu_type="v100l"))) == "--gpus-per-node=v100l:1"


def test_one_job_gets_at_most_the_mig_slices_the_site_allows():
    alliance = profiles.load_profile("alliance")
    error = _field_of(alliance, _ok(gpus=2, gpu_type="a100_3g.20gb"))
    assert error.message == (
        "gpus: 2 a100_3g.20gb MIG slices in one job; cluster 'alliance' allows up to 1 "
        "(allowed: 1, or whole GPUs)"
    )
    assert _field_of(alliance, _ok(gpus=1, nodes=2, gpu_type="a100_1g.5gb")).field == "gpus"
    assert resolve(alliance, _ok(gpus=1, gpu_type="a100_3g.20gb")).gpus == 1
    assert resolve(alliance, _ok(gpus=4, gpu_type="a100")).gpus == 4


def test_single_type_partition_fills_in_a_required_type():
    m3 = profiles.load_profile("m3")
    checked = resolve(m3, _ok(partition="desktop", gpus=1))
    assert (checked.gpu_type, checked.qos) == ("P4", "desktopq")


def test_partition_qos_cannot_be_overridden():
    error = _field_of(profiles.load_profile("m3"), _ok(partition="desktop", qos="normal"))
    assert error.field == "qos"
    assert "desktopq" in error.message


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (_ok(array="1-"), "array"),
        (_ok(array="0-9%"), "array"),
        (_ok(mail_user="not an address"), "mail_user"),
        (_ok(mail_user="me@example.org", mail_type="SOMETIMES"), "mail_type"),
        (_ok(extra=("--exclusive", "rm -rf /")), "extra"),
        (_ok(extra=("--output=/tmp/x",)), "extra"),
        (_ok(extra=("--chdir=/tmp",)), "extra"),
        (_ok(nodes=0), "nodes"),
        (_ok(gpus=-1), "gpus"),
        (_ok(cpus=0), "cpus"),
        (_ok(ntasks_per_node=0), "ntasks_per_node"),
        (ResourceRequest(job_name="train", account="def smith"), "account"),
        (ResourceRequest(job_name="a\nb", account="x"), "job_name"),
        (ResourceRequest(job_name="", account="x"), "job_name"),
    ],
)
def test_every_rule_names_its_field(site, request_: ResourceRequest, field: str):
    assert _field_of(site, request_).field == field


@pytest.mark.parametrize(
    ("given", "extra", "message"),
    [
        ({"mem": "16G"}, ("--mem-per-cpu=4G",), "--mem-per-cpu conflicts with --mem 16G (use one of them)"),
        ({"mem": "16G"}, ("--mem-per-gpu=40G",), "--mem-per-gpu conflicts with --mem 16G (use one of them)"),
        ({}, ("--ntasks=8",), "--ntasks sets a task count beside --ntasks-per-node (use --nodes and "
                              "--ntasks-per-node)"),
        ({}, ("--no-requeue",), "--no-requeue stops the requeue after a checkpoint (use --max-restarts 0)"),
        ({"gpus": 1}, ("--gpus-per-task=1",), "--gpus-per-task allocates GPUs hpcbox starts no process for "
                                              "(use --gpus, per node)"),
        ({}, ("--tres-per-task=gres/gpu:1",),
         "--tres-per-task sizes tasks behind --cpus-per-task and the GPU request (use --cpus and --gpus)"),
        ({}, ("--gres=gpu:2",),
         "--gres=gpu:2: gpu:2 reaches GPUs behind hpcbox's back (use --gpus/--gpu-type)"),
        ({}, ("--gres=lscratch:10,shard:2",), "--gres=lscratch:10,shard:2: shard:2 reaches GPUs behind "
                                              "hpcbox's back (use --gpus/--gpu-type)"),
        ({}, ("--gres=lscratch 10",),
         "--gres=lscratch 10: not a list of name[:type][:count] (e.g. lscratch:10)"),
        ({}, ("--time=1:00:00",), "--time is written by hpcbox (use --time)"),
        ({}, ("--part=gpu",), "--part abbreviates --partition (spell sbatch options out in full)"),
        ({}, ("--no-re",), "--no-re abbreviates --no-requeue (spell sbatch options out in full)"),
        ({}, ("--constraint=a100", "--exclusive", "--constraint=v100"),
         "--constraint is given twice (sbatch keeps only the last; give it once)"),
    ],
)  # fmt: skip
def test_extra_options_cannot_undo_what_hpcbox_writes(site, given, extra, message):
    error = _field_of(site, _ok(extra=extra, **given))
    assert error.field == "extra"
    assert error.message == f"extra: {message}"


def test_extra_options_that_change_nothing_hpcbox_writes_pass_through(site):
    extra = ("--exclusive", "--constraint=a100", "--mem-per-cpu=4G", "--gpu-bind=closest", "--time-min=30",
             "--gres=lscratch:10")  # fmt: skip
    assert resolve(site, _ok(gpus=2, extra=extra)).extra == extra


def test_a_valid_request_is_normalised(site):
    checked = resolve(
        site,
        _ok(gpus=2, gpu_type="a100", cpus=8, mem="32gb", time="12:00:00", array="0-9%2",
            mail_user="me@example.org", extra=("--exclusive",)),
    )  # fmt: skip
    assert checked.partition.name == "gpu"
    assert (checked.mem, checked.time_s, checked.mail_type) == ("32G", 12 * 3600, "END,FAIL")
    assert checked.signal_margin_s == 300


def test_signal_margin_shrinks_for_short_jobs(site):
    assert resolve(site, _ok(time="10")).signal_margin_s == 60
    assert resolve(site, _ok(time="30")).signal_margin_s == 180


def test_project_defaults_with_a_per_cluster_table(tmp_path: Path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        "[tool.hpcbox.resources]\ngpus = 1\nmem = '8G'\ntime = '1:00:00'\n"
        "[tool.hpcbox.resources.alliance]\naccount = 'def-smith'\nmem = '16G'\n"
    )
    assert project_defaults(pyproject, "edi") == ResourceRequest(gpus=1, mem="8G", time="1:00:00")
    assert project_defaults(pyproject, "alliance") == ResourceRequest(
        gpus=1, mem="16G", time="1:00:00", account="def-smith"
    )


def test_flags_win_over_project_defaults(tmp_path: Path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text("[tool.hpcbox.resources]\ngpus = 1\nmem = '8G'\nextra = ['--exclusive']\n")
    request = request_for("edi", {"gpus": "2", "mem": None, "extra": []}, pyproject, "trainer")
    assert request == ResourceRequest(job_name="trainer", gpus=2, mem="8G", extra=("--exclusive",))


def test_bad_project_default_names_its_key(tmp_path: Path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text("[tool.hpcbox.resources]\ngpu = 1\n")
    with pytest.raises(FieldError) as caught:
        project_defaults(pyproject, "edi")
    assert caught.value.field == "tool.hpcbox.resources.gpu"


def test_non_numeric_flag_names_its_field(tmp_path: Path):
    with pytest.raises(FieldError) as caught:
        request_for("edi", {"cpus": "four"}, tmp_path / "pyproject.toml", "trainer")
    assert caught.value.field == "cpus"


def test_max_restarts_is_bounded_by_default_and_checked(site, tmp_path: Path):
    assert resolve(site, _ok()).max_restarts == DEFAULT_MAX_RESTARTS
    assert resolve(site, _ok(max_restarts=0)).max_restarts == 0
    assert _field_of(site, _ok(max_restarts=-1)).field == "max_restarts"
    above = _field_of(site, _ok(max_restarts=MAX_RESTARTS_LIMIT + 1))
    assert above.field == "max_restarts" and f"0-{MAX_RESTARTS_LIMIT}" in above.message
    with pytest.raises(FieldError) as caught:
        request_for("edi", {"max_restarts": "lots"}, tmp_path / "pyproject.toml", "trainer")
    assert caught.value.field == "max_restarts"
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text("[tool.hpcbox.resources]\nmax-restarts = 3\n")
    assert request_for("edi", {}, pyproject, "trainer").max_restarts == 3


def test_a_site_with_default_accounts_needs_no_account():
    alliance = profiles.load_profile("alliance")
    assert not alliance.account_required
    assert resolve(alliance, ResourceRequest(job_name="j", gpus=1, gpu_type="a100")).account is None


def test_the_environment_satisfies_a_required_account_and_a_flag_wins_over_it(tmp_path: Path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text("[tool.hpcbox.resources]\naccount = 'from-pyproject'\nqos = 'normal'\n")
    environ = {"SBATCH_ACCOUNT": "from-env", "SBATCH_PARTITION": "m3g", "SBATCH_QOS": "", "HOME": "/x"}
    m3 = profiles.load_profile("m3")
    from_env = request_for("m3", {}, tmp_path / "none.toml", "trainer", environ)
    assert (from_env.account, from_env.partition, from_env.qos) == ("from-env", "m3g", None)
    assert resolve(m3, from_env).account == "from-env"  # the site requires one: the environment gives it
    flagged = request_for("m3", {"account": "from-flag"}, pyproject, "trainer", environ)
    assert (flagged.account, flagged.qos) == ("from-flag", "normal")  # flag > environment > pyproject
    assert request_for("m3", {}, pyproject, "trainer", environ).account == "from-env"


def test_a_malformed_sbatch_variable_is_named(tmp_path: Path):
    with pytest.raises(FieldError) as refused:
        request_for("edi", {}, tmp_path / "none.toml", "trainer", {"SBATCH_ACCOUNT": "a b"})
    assert refused.value.field == "SBATCH_ACCOUNT"
    assert refused.value.message == "SBATCH_ACCOUNT: 'a b' is not a Slurm account name"


def test_a_missing_required_account_says_how_to_give_one(site):
    error = _field_of(site, ResourceRequest(job_name="train"))
    assert "SBATCH_ACCOUNT" in error.hint


@pytest.mark.parametrize(
    ("given", "field", "says"),
    [
        ({"container": "docker"}, "container", "'docker' (allowed: apptainer, singularity)"),
        ({"bind": ("data:/data",)}, "bind", "use absolute paths"),
        ({"bind": ("/data:/scratch",)}, "bind", "/scratch is where hpcbox binds the job's scratch or code"),
        ({"bind": ("/a,/b",)}, "bind", "contains ','"),
        ({"bind": ("/data:/data:rx",)}, "bind", "'rx' is not a bind option (allowed: ro, rw)"),
        ({"bind": ("/data", "/other:/data/")}, "bind", "/data is already bound by an earlier --bind"),
        ({"home": "/h:/code"}, "home", "/code is where hpcbox binds"),
        ({"home": "/h", "no_home": True}, "home", "given with --no-home (use one of them)"),
    ],
)
def test_container_options_are_checked_and_name_their_flag(site, given, field, says):
    error = _field_of(site, _ok(**given))
    assert error.field == field
    assert says in error.message


def test_a_bind_over_one_the_profile_makes_is_refused():
    alliance = profiles.load_profile("alliance")
    error = _field_of(alliance, _ok(bind=("/home/me/project:/project",)))
    assert error.message == "bind: '/home/me/project:/project': /project is already bound by the profile"


def test_container_options_from_flags_and_pyproject(tmp_path: Path, site):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text("[tool.hpcbox.resources]\ncleanenv = true\nbind = ['/data:/data:ro']\n")
    # Switches left off (False) and empty lists leave the project's defaults be.
    flags = {"cleanenv": False, "no_home": True, "bind": [], "container": "singularity"}
    request = request_for("edi", flags, pyproject, "trainer")
    container = resolve(site, dataclasses.replace(request, account="a")).container
    assert container == ContainerOptions(
        "singularity", cleanenv=True, no_home=True, binds=("/data:/data:ro",), unpack_sif=None
    )  # edi's profile does not know whether its nodes have FUSE: each job's nodes find out
    pyproject.write_text("[tool.hpcbox.resources]\ncleanenv = 'yes'\n")
    with pytest.raises(FieldError) as refused:
        request_for("edi", {}, pyproject, "trainer")
    assert refused.value.field == "tool.hpcbox.resources.cleanenv"


def test_sif_on_scratch_comes_from_the_flag_over_pyproject_over_the_profile(tmp_path: Path, site):
    pyproject = tmp_path / "pyproject.toml"
    copying = dataclasses.replace(site, apptainer=dataclasses.replace(site.apptainer, sif_on_scratch=True))

    def wanted(profile, table: str, flags: dict) -> bool:
        pyproject.write_text(f"[tool.hpcbox.resources]\n{table}")
        request = dataclasses.replace(request_for("edi", flags, pyproject, "t"), account="a")
        return resolve(profile, request).container.sif_on_scratch

    assert wanted(site, "", {}) is False  # the default: the SIF is read where it was shipped
    assert wanted(copying, "", {}) is True  # the site's profile asks for it
    assert wanted(copying, "sif_on_scratch = false\n", {"sif_on_scratch": False}) is False
    assert wanted(site, "sif-on-scratch = false\n", {"sif_on_scratch": True}) is True
    with pytest.raises(FieldError) as refused:
        wanted(site, "sif_on_scratch = 1\n", {})
    assert refused.value.field == "tool.hpcbox.resources.sif_on_scratch"


def test_a_gpu_job_that_leaves_its_time_memory_or_cpus_to_the_site_is_told_so():
    """Issue 59: an edi GPU script got no --time, --mem or CPUs per GPU, and nothing said so."""
    edi = profiles.load_profile("edi")
    bare = resolve(edi, ResourceRequest(job_name="train", gpus=2))
    assert bare.unverified == (
        "a job with 2 GPUs that asks for no --time, --mem or --cpus gets edi's defaults there, which its "
        "profile does not record (often 1 CPU, a little memory, a short limit): ask for what it needs",
    )
    some = resolve(edi, ResourceRequest(job_name="train", gpus=1, time="2:00:00", cpus=4))
    assert some.unverified == (
        "a job with 1 GPU that asks for no --mem gets edi's defaults there, which its profile does not "
        "record (often 1 CPU, a little memory, a short limit): ask for what it needs",
    )
    whole = ResourceRequest(job_name="train", gpus=1, time="2:00:00", cpus=4, mem="16G")
    assert resolve(edi, whole).unverified == ()
    assert resolve(edi, ResourceRequest(job_name="train")).unverified == ()  # a CPU job: the defaults fit
