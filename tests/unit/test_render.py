"""The rendered job script: golden files, shellcheck, quoting, and its behaviour when run.

The behaviour tests run the real script with bash on this machine, with node scratch in a temporary
directory and two stand-ins on PATH: `apptainer` (records its argv, then acts as a trainer that
succeeds, fails, checkpoints, or waits for a signal) and `scontrol` (records a requeue). The same
script runs on the mini cluster with the real Apptainer and Slurm in tests/integration.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcbox.project.command import EXAMPLE_TRAINER, NOTEBOOK, ContainerCommand, Step, Steps
from hpcbox.render import profiles
from hpcbox.render.bsub import renderer
from hpcbox.render.resources import FieldError, ResourceRequest, request_for, resolve
from hpcbox.render.sbatch import JobInputs, JobScript, render_sbatch, render_shell, sbatch_quote
from hpcbox.render.sweep import Sweep

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "sbatch"
# LSF sites' scripts (scheduler = "lsf" in the profile) have goldens of their own.
GOLDEN_BSUB = GOLDEN.parent / "bsub"
UPDATE = os.environ.get("HPCBOX_UPDATE_GOLDEN") == "1"
TRAINER_ARGS = ("--epochs", "3", "--model", "cnn", "--note", "it's $HOME and `date`")
INPUTS = JobInputs.defaults(
    "trainer", sif_sha256="0" * 64, code_revision="0123456789abcdef0123456789abcdef01234567"
)

# One representative job per shipped profile: what a user of that site would typically ask for.
GOLDEN_REQUESTS = {
    "edi": ResourceRequest(job_name="digits", partition="PGR-Standard", gpus=2, cpus=4, mem="32G",
                           time="1-00:00:00"),
    "m3": ResourceRequest(job_name="digits", partition="desktop", gpus=1, account="ab12", time="2:00:00"),
    "alliance": ResourceRequest(job_name="digits", gpus=1, gpu_type="a100", cpus=8, mem="40G",
                                time="3:00:00", account="def-smith"),
    "mila": ResourceRequest(job_name="digits sweep", partition="long", gpus=1, cpus=4, mem="24G",
                            time="12:00:00", array="0-3%2"),
    "carc": ResourceRequest(job_name="digits", gpus=1, account="ttrojan_123", time="1:00:00",
                            mail_user="ttrojan@usc.edu"),
    "local": ResourceRequest(job_name="digits-ddp", partition="gpu", gpus=2, nodes=2, ntasks_per_node=2,
                             time="10", extra=("--exclusive",)),
    "dtu": ResourceRequest(job_name="digits", partition="gpua100", gpus=2, cpus=4, mem="32G", time="12:00:00",
                           mail_user="s123456@dtu.dk"),
}  # fmt: skip


def render(name: str, request: ResourceRequest, args=TRAINER_ARGS, inputs=INPUTS) -> JobScript:
    """The profile's own job script: sbatch, or bsub for an LSF site."""
    profile = profiles.load_profile(name)
    return renderer(profile)(profile, resolve(profile, request), inputs, tuple(args))


def shellcheck(text: str) -> subprocess.CompletedProcess:
    program = shutil.which("shellcheck")
    if program is None:
        pytest.fail("shellcheck is not installed (apt-get install shellcheck)", pytrace=False)
    return subprocess.run([program, "--shell=bash", "-"], input=text, capture_output=True, text=True)


def bash_syntax(text: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-n"], input=text.encode(), capture_output=True)


@pytest.mark.parametrize("name", sorted(GOLDEN_REQUESTS))
def test_golden_script(name: str):
    text = render(name, GOLDEN_REQUESTS[name]).text
    golden = (GOLDEN_BSUB if profiles.load_profile(name).lsf else GOLDEN) / f"{name}.sh"
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.is_file(), f"no golden file {golden}: render it with HPCBOX_UPDATE_GOLDEN=1 and review it"
    assert text == golden.read_text()


@pytest.mark.parametrize("name", sorted(GOLDEN_REQUESTS))
def test_every_profile_renders_a_script_that_passes_bash_n_and_shellcheck(name: str):
    text = render(name, GOLDEN_REQUESTS[name]).text
    assert bash_syntax(text).returncode == 0
    checked = shellcheck(text)
    assert checked.returncode == 0, checked.stdout
    assert checked.stdout == ""


def test_cpu_only_job_has_no_nv_and_no_gpu_sampler():
    text = render("local", ResourceRequest(job_name="cpu job")).text
    assert "--nv" not in text
    assert "nvidia-smi" not in text
    assert "--gres" not in text
    assert shellcheck(text).stdout == ""


def test_a_gpu_job_of_ones_own_program_checks_its_gpus_before_it_starts():
    """The check runs in the container before the program; the example trainer makes it itself, and a
    CPU job has none. Where the environment has no PyTorch to ask, the check lets the program start."""
    program = ContainerCommand("program", "fit", ("{output_dir}",))
    profile = profiles.load_profile("edi")
    own = render_sbatch(profile, resolve(profile, ResourceRequest(job_name="j", gpus=1)), INPUTS, (), program)
    check = own.text.index("gpu_check=")
    assert check < own.text.index("apptainer exec --nv --bind") < own.text.index(" fit /scratch/out")
    assert 'apptainer exec --nv "$sif" python3 -c "$gpu_check" "$SLURM_GPUS_ON_NODE"' in own.text
    assert shellcheck(own.text).stdout == ""
    assert "gpu_check" not in render("edi", ResourceRequest(job_name="j", gpus=1)).text  # the trainer's own
    cpu_only = render_sbatch(profile, resolve(profile, ResourceRequest(job_name="j")), INPUTS, (), program)
    assert "gpu_check" not in cpu_only.text
    # No PyTorch here (hpcbox's own environment): nothing to ask, the program goes (exit 0, silent).
    from hpcbox.render.sbatch import _GPU_CHECK

    assert "'" not in _GPU_CHECK  # held in single quotes by the script
    done = subprocess.run([sys.executable, "-c", _GPU_CHECK, "2", ""], capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (0, "")


def test_gpu_request_in_each_sites_dialect():
    def gpu_lines(name: str, request: ResourceRequest) -> list[str]:
        return [
            line
            for line in render(name, request).text.splitlines()
            if line.startswith(("#SBATCH --gres", "#SBATCH --gpus"))
        ]

    assert gpu_lines("edi", ResourceRequest(job_name="j", gpus=2)) == ["#SBATCH --gres=gpu:2"]
    assert gpu_lines("carc", ResourceRequest(job_name="j", gpus=1, account="a")) == ["#SBATCH --gres=gpu:1"]
    assert gpu_lines("carc", ResourceRequest(job_name="j", gpus=2, gpu_type="a100", account="a")) == [
        "#SBATCH --gres=gpu:a100:2"
    ]
    assert gpu_lines("alliance", ResourceRequest(job_name="j", gpus=1, gpu_type="a100_3g.20gb")) == [
        "#SBATCH --gpus-per-node=a100_3g.20gb:1"
    ]
    assert gpu_lines("alliance", ResourceRequest(job_name="j", gpus=4, gpu_type="v100l")) == [
        "#SBATCH --gpus-per-node=v100l:4"
    ]
    assert gpu_lines("alliance", ResourceRequest(job_name="j", gpus=2, gpu_type="h100", account="def-x")) == [
        "#SBATCH --gpus-per-node=h100:2"
    ]
    assert gpu_lines("m3", ResourceRequest(job_name="j", partition="desktop", gpus=1, account="a")) == [
        "#SBATCH --gres=gpu:P4:1"
    ]


def test_the_sites_other_generic_resources_share_the_gpus_gres_line():
    """sbatch keeps only the last --gres, so --extra=--gres=... joins the GPU request's line."""

    def gres_lines(name: str, request: ResourceRequest) -> list[str]:
        text = render(name, request).text
        assert shellcheck(text).stdout == ""
        return [line for line in text.splitlines() if line.startswith(("#SBATCH --gres", "#SBATCH --gpus"))]

    disk = ("--gres=lscratch:10",)
    assert gres_lines("edi", ResourceRequest(job_name="j", gpus=2, extra=disk)) == [
        "#SBATCH --gres=gpu:2,lscratch:10"
    ]
    assert gres_lines("edi", ResourceRequest(job_name="j", extra=disk)) == ["#SBATCH --gres=lscratch:10"]
    assert gres_lines("alliance", ResourceRequest(job_name="j", gpus=1, gpu_type="a100", extra=disk)) == [
        "#SBATCH --gpus-per-node=a100:1",
        "#SBATCH --gres=lscratch:10",
    ]


def test_alliance_script_contains_the_runtime_and_writes_no_partition():
    text = render("alliance", GOLDEN_REQUESTS["alliance"]).text
    assert "--partition" not in text
    assert "module load apptainer" in text
    assert '--containall --workdir "$job_scratch/tmp"' in text
    assert '"${SLURM_TMPDIR:?' in text


def test_array_jobs_log_and_store_per_task():
    text = render("mila", GOLDEN_REQUESTS["mila"]).text
    assert "#SBATCH --output=logs/digits_sweep-%A_%a.out" in text
    assert 'job_key="${SLURM_ARRAY_JOB_ID}/${SLURM_ARRAY_TASK_ID}"' in text


def test_nul_in_a_trainer_argument_is_refused():
    with pytest.raises(FieldError) as caught:
        render("local", ResourceRequest(job_name="j"), args=("a\0b",))
    assert caught.value.field == "trainer_args"


def test_control_characters_in_an_input_path_are_refused():
    with pytest.raises(FieldError) as caught:
        render("local", ResourceRequest(job_name="j"), inputs=dataclasses.replace(INPUTS, sif="a\nb.sif"))
    assert caught.value.field == "inputs.sif"


def test_write_is_atomic_and_executable(tmp_path: Path):
    script = render("local", ResourceRequest(job_name="j"))
    target = tmp_path / "jobs" / "job.sh"
    script.write(target)
    assert target.read_text() == script.text
    assert os.access(target, os.X_OK)
    assert sorted(p.name for p in target.parent.iterdir()) == ["job.sh"]


# --- sbatch's own parsing of #SBATCH lines -------------------------------------------------------


def sbatch_argument(line: str) -> str:
    """One argument as sbatch reads it from an #SBATCH line (Slurm's src/sbatch/opt.c, _get_argument):
    quotes ' or " group, a backslash escapes the next character, an unquoted # starts a comment."""
    out, quote, escape = [], None, False
    for char in line.lstrip():
        if escape:
            escape = False
        elif char == "\\":
            escape = True
            continue
        elif quote:
            if char == quote:
                quote = None
                continue
        elif char in "\"'":
            quote = char
            continue
        elif char == "#" or char.isspace():
            break
        out.append(char)
    assert quote is None, f"unmatched quote in {line!r}"
    return "".join(out)


job_names = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cf", "Zl", "Zp", "Cs")), min_size=1, max_size=40
)


@settings(max_examples=200, deadline=None)
@given(job_names)
def test_sbatch_reads_back_exactly_the_job_name(name: str):
    line = f"--job-name={sbatch_quote(name)}"
    assert sbatch_argument(line) == f"--job-name={name}"


# --- running the script --------------------------------------------------------------------------

STUB_APPTAINER = r'''#!/usr/bin/env python3
"""Stand-in for `apptainer exec`: records argv, then acts as the trainer as $STUB_MODE says."""
import json, os, pathlib, signal, sys, time

args = sys.argv[1:]
if args == ["--version"]:  # the job's check that the runtime runs on the node
    sys.exit(print("apptainer version 0 (stand-in)"))
if args[0] == "exec" and args[2:] == ["true"]:  # the job's check that a node can mount the SIF
    if os.environ.get("STUB_USR1_WHILE_STAGING"):  # to the job script, this one's parent's parent
        script = int(pathlib.Path(f"/proc/{os.getppid()}/stat").read_text().rsplit(")", 1)[1].split()[1])
        os.kill(script, signal.SIGUSR1)
    if os.environ.get("STUB_MOUNT_EXTRACTS"):  # Apptainer without squashfuse
        print("INFO:    Converting SIF file to temporary sandbox...", file=sys.stderr)
    sys.exit(int(os.environ.get("STUB_MOUNT_FAILS", "0")))
if args[0] == "build":  # unpacking: the sandbox, a folder holding the SIF's bytes
    pathlib.Path(args[-2]).mkdir()
    pathlib.Path(args[-2], "image").write_bytes(pathlib.Path(args[-1]).read_bytes())
    sys.exit(0)
pathlib.Path(os.environ["STUB_RECORD"]).write_text(json.dumps(args))
scratch = next(a.split(":")[0] for a in args if a.endswith(":/scratch"))
out = pathlib.Path(scratch, "out")
pathlib.Path(os.environ["STUB_SCRATCH_SEEN"]).write_text(scratch)
handed = {name: value for name, value in os.environ.items() if "ENV_JUPYTER_" in name}
if handed:  # a notebook: what the container is given, and the runtime folder's mode
    runtime = pathlib.Path(scratch, os.environ["APPTAINERENV_JUPYTER_RUNTIME_DIR"].removeprefix("/scratch/"))
    handed["mode"] = oct(runtime.stat().st_mode & 0o777)
    config = pathlib.Path(scratch, os.environ["APPTAINERENV_JUPYTER_CONFIG_PATH"].removeprefix("/scratch/"))
    handed["config"] = json.loads((config / "jupyter_server_config.json").read_text())
    pathlib.Path(os.environ["STUB_RECORD"]).with_name("notebook.json").write_text(json.dumps(handed))
mode = os.environ.get("STUB_MODE", "ok")
(out / "metrics.jsonl").write_text('{"epoch": 1}\n')

def checkpoint(signum, frame):
    (out / "checkpoints").mkdir(exist_ok=True)
    (out / "checkpoints" / "last.pt").write_text(signal.Signals(signum).name)
    sys.exit(75)

if mode == "fail":
    sys.exit(3)
if mode == "checkpoint":
    checkpoint(signal.SIGUSR1, None)
if mode == "wait":
    signal.signal(signal.SIGUSR1, checkpoint)
    signal.signal(signal.SIGTERM, checkpoint)
    pathlib.Path(os.environ["STUB_READY"]).write_text(str(os.getpid()))
    time.sleep(60)
    sys.exit(9)
'''

# Stand-in for scontrol: what it shows is read, what it does is logged. The job's Restarts is
# $STUB_RESTARTS: one more than the run's SLURM_RESTART_COUNT once Slurm has decided to requeue it; its
# PreemptTime is $STUB_PREEMPT_TIME: the pick's time from a preemption's pick on, else None.
STUB_SCONTROL = """#!/bin/sh
if [ "$1 $2" = "show hostnames" ]; then
    printf 'node1\\nnode2\\n'
    exit 0
fi
if [ "$1 $2" = "show job" ]; then
    printf 'JobId=%s JobName=job\\n   JobState=COMPLETING Reason=None\\n' "$3"
    printf '   Requeue=1 Restarts=%s BatchFlag=1\\n' "${STUB_RESTARTS:-0}"
    printf '   PreemptEligibleTime=2026-12-06T21:00:00 PreemptTime=%s\\n' "${STUB_PREEMPT_TIME:-None}"
    exit 0
fi
echo "$@" >>"$STUB_SCONTROL_LOG"
"""

STUB_SCANCEL = """#!/bin/sh
echo "scancel $*" >>"$STUB_SCONTROL_LOG"
"""

# Stand-in for srun on a one-node "cluster": drops srun's options, runs the command as node 0.
STUB_SRUN = """#!/bin/bash
while [[ $1 == --* ]]; do shift; done
SLURM_NODEID=0 exec "$@"
"""


@dataclasses.dataclass
class Sandbox:
    root: Path
    submit: Path
    node_scratch: Path
    env: dict[str, str]

    @property
    def recorded_argv(self) -> list[str]:
        return json.loads((self.root / "argv.json").read_text())

    @property
    def run_dir(self) -> Path:
        return self.submit / "runs" / "4242"

    @property
    def scratch_was(self) -> Path:
        return Path((self.root / "scratch-seen").read_text())

    def slurm_calls(self) -> list[str]:
        log = self.root / "scontrol.log"
        return log.read_text().splitlines() if log.exists() else []

    def script(
        self,
        request: ResourceRequest,
        args: tuple[str, ...] = (),
        command: ContainerCommand = EXAMPLE_TRAINER,
        sweep: Sweep | None = None,
        submission: str | None = None,
    ) -> JobScript:
        local = profiles.load_profile("local")
        profile = dataclasses.replace(local, node_scratch=str(self.node_scratch))
        checked = resolve(profile, request, ddp=command.ddp)
        inputs = JobInputs.defaults("trainer", submission=submission)
        return render_sbatch(profile, checked, inputs, args, command, sweep=sweep)

    def start(self, script: JobScript, mode: str) -> subprocess.Popen:
        path = self.submit / "job.sh"
        script.write(path)
        return subprocess.Popen(
            ["bash", str(path)], cwd=self.submit, env={**self.env, "STUB_MODE": mode},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def run(self, script: JobScript, mode: str = "ok") -> tuple[int, str]:
        process = self.start(script, mode)
        try:
            output, _ = process.communicate(timeout=60)
        except subprocess.TimeoutExpired as expired:
            # What still runs of it, and on what each waits: the script itself, or a process of its
            # session keeping its output open after it ended.
            left = subprocess.run(
                ["ps", "-o", "pid,ppid,stat,etimes,wchan:24,args", "-s", str(process.pid)],
                capture_output=True, text=True, check=False,
            ).stdout  # fmt: skip
            said = (expired.output or b"").decode(errors="replace")
            raise AssertionError(f"the job script did not end in 60 s; its session:\n{left}{said}") from None
        finally:
            # A script that did not end (the test fails) leaves nothing of its session running.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        return process.returncode, output.decode(errors="replace")


def make_sandbox(root: Path) -> Sandbox:
    submit = root / "submit"
    for directory in ("images", "code/hpctrain", "data", "logs"):
        (submit / directory).mkdir(parents=True)
    (submit / "images" / "trainer.sif").write_bytes(b"not really a SIF")
    shard = root / "shard-0000.npz"
    shard.write_bytes(b"digits")
    with tarfile.open(submit / "data" / "trainer.tar", "w") as archive:
        archive.add(shard, arcname="shard-0000.npz")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    stubs = {"apptainer": STUB_APPTAINER, "scontrol": STUB_SCONTROL, "scancel": STUB_SCANCEL}
    for name, body in {**stubs, "srun": STUB_SRUN}.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    node_scratch = root / "node-scratch"
    node_scratch.mkdir()
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(root),
        "USER": "researcher",
        "SLURM_JOB_ID": "4242",
        "SLURMD_NODENAME": "node1",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_SUBMIT_DIR": str(submit),
        "STUB_RECORD": str(root / "argv.json"),
        "STUB_SCRATCH_SEEN": str(root / "scratch-seen"),
        "STUB_READY": str(root / "ready"),
        "STUB_SCONTROL_LOG": str(root / "scontrol.log"),
    }
    return Sandbox(root, submit, node_scratch, env)


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    return make_sandbox(tmp_path)


def trainer_argv_tail(argv: list[str]) -> list[str]:
    """The user's arguments: everything after `--output-dir /scratch/out`."""
    return argv[argv.index("--output-dir") + 2 :]


def test_success_copies_results_back_and_removes_scratch(sandbox: Sandbox):
    status, output = sandbox.run(sandbox.script(ResourceRequest(job_name="ok"), ("--epochs", "1")))
    assert status == 0, output
    argv = sandbox.recorded_argv
    assert argv[:1] == ["exec"] and "--nv" not in argv
    assert argv[argv.index("--env") + 1] == "PYTHONPATH=/code"
    assert f"{sandbox.submit}/code:/code:ro" in argv
    assert trainer_argv_tail(argv) == ["--epochs", "1"]
    assert (sandbox.run_dir / "metrics.jsonl").read_text() == '{"epoch": 1}\n'
    assert sandbox.scratch_was.parent == sandbox.node_scratch / "researcher"
    assert not sandbox.scratch_was.exists()
    assert sandbox.slurm_calls() == []


def test_trackers_keep_their_runs_in_the_output_folder_and_go_offline_where_nodes_reach_no_internet(
    sandbox: Sandbox,
):
    """W&B's and MLflow's local runs land in the output folder, which comes home (their defaults are the
    working directory's, on node scratch); on a site whose profile says compute_internet = false (edi),
    W&B runs offline and Hugging Face's hub is not tried. A value the job's environment has wins."""
    offline = ('--env "WANDB_MODE=${WANDB_MODE:-offline}"', '--env "HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}"')
    edi, local = (render(name, ResourceRequest(job_name="x")).text for name in ("edi", "local"))
    assert profiles.load_profile("edi").compute_internet is False and all(unit in edi for unit in offline)
    assert profiles.load_profile("local").compute_internet is True and not any(
        unit in local for unit in offline
    )
    sandbox.env["WANDB_DIR"] = "/home/researcher/wandb-runs"
    status, output = sandbox.run(sandbox.script(ResourceRequest(job_name="ok"), ("--epochs", "1")))
    assert status == 0, output
    handed = {
        value
        for option, value in zip(sandbox.recorded_argv, sandbox.recorded_argv[1:], strict=False)
        if option == "--env"
    }
    assert {"WANDB_DIR=/home/researcher/wandb-runs", "MLFLOW_TRACKING_URI=file:///scratch/out/mlruns",
            "MLFLOW_ALLOW_FILE_STORE=true"} <= handed  # fmt: skip


def test_a_w_and_b_run_keeps_one_id_through_the_jobs_requeues_one_a_task_and_a_submission(sandbox: Sandbox):
    """W&B's run id is the submission's and the task's, the same in a requeued run (SLURM_RESTART_COUNT),
    resumed where it exists (its curves go on in one run; its offline runs sync as one); the job's own
    WANDB_RUN_ID wins."""
    submission = "train-20261206T143500-1a2b3c4d.sh"

    def handed_wandb(**env: str) -> dict[str, str]:
        sandbox.env.update(env)
        # Each run the first to finish: one that finds an earlier run's exit status does not run again.
        shutil.rmtree(sandbox.run_dir, ignore_errors=True)
        (sandbox.root / "argv.json").unlink(missing_ok=True)
        status, output = sandbox.run(sandbox.script(ResourceRequest(job_name="ok"), submission=submission))
        assert status == 0, output
        argv = sandbox.recorded_argv
        pairs = [value.split("=", 1) for option, value in itertools.pairwise(argv) if option == "--env"]
        return {name: value for name, value in pairs if name in ("WANDB_RUN_ID", "WANDB_RESUME")}

    first = handed_wandb()
    assert first == {"WANDB_RUN_ID": "train-20261206T143500-1a2b3c4d-4242", "WANDB_RESUME": "allow"}
    assert handed_wandb(SLURM_RESTART_COUNT="1") == first
    assert handed_wandb(WANDB_RUN_ID="mine")["WANDB_RUN_ID"] == "mine"
    swept = sandbox.script(
        ResourceRequest(job_name="ok", array="0-1"),
        sweep=Sweep("sweep.toml", (("--lr", "1"), ("--lr", "2"))),
        submission=submission,
    )
    lines = [line for line in swept.text.splitlines() if line.startswith(("job_key=", "tracking_id="))]
    task = {"SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": "1", "PATH": os.environ["PATH"]}
    said = subprocess.run(
        ["bash", "-c", "\n".join([*lines, 'echo "$tracking_id"'])], env=task, capture_output=True, text=True
    )
    assert said.stdout == "train-20261206T143500-1a2b3c4d-4242-1\n", said.stderr


def test_the_dataset_archive_is_extracted_on_node_scratch(sandbox: Sandbox):
    """The stand-in sees the scratch directory while the job runs; the shard was there."""
    script = sandbox.script(ResourceRequest(job_name="data"))
    probe = sandbox.root / "bin" / "apptainer"
    probe.write_text(
        STUB_APPTAINER + "\nassert (pathlib.Path(scratch) / 'data' / 'shard-0000.npz').is_file()\n"
    )
    status, output = sandbox.run(script)
    assert status == 0, output


def test_failing_trainer_still_copies_back_and_cleans_up(sandbox: Sandbox):
    status, output = sandbox.run(sandbox.script(ResourceRequest(job_name="fail")), mode="fail")
    assert status == 3, output
    assert (sandbox.run_dir / "metrics.jsonl").exists()
    assert (sandbox.run_dir / ".hpcbox-exit").read_text() == "3\n"  # its outcome, kept with its results
    # Its copy-back worked and says nothing: the EXIT trap's bare `return` once made it "failed".
    said = [line for line in output.splitlines() if line.startswith("hpcbox: ")]
    assert said[-1] == "hpcbox: the trainer exited with status 3", output
    assert not sandbox.scratch_was.exists()
    assert sandbox.slurm_calls() == []


def test_a_run_folder_of_an_earlier_job_given_the_same_id_is_left_as_it_is(sandbox: Sandbox):
    """Slurm gives an id again (a rebuilt controller, ids wrapped): the job whose id it is now neither
    resumes from nor copies into the earlier job's results; its own requeue does."""
    earlier = sandbox.run_dir
    (earlier / "checkpoints").mkdir(parents=True)
    (earlier / "checkpoints" / "last.pt").write_text("the earlier job's")
    (earlier / ".hpcbox-submission").write_text("trainer-20261201T100000-aaaaaaaa.sh\n")
    before = sorted(
        (path.relative_to(earlier), path.read_bytes()) for path in earlier.rglob("*") if path.is_file()
    )
    script = sandbox.script(
        ResourceRequest(job_name="again"), submission="trainer-20270101T000000-bbbbbbbb.sh"
    )
    status, output = sandbox.run(script)
    assert status == 66, output
    said = [line for line in output.splitlines() if line.startswith("hpcbox: ")]
    assert said[-1] == (
        f"hpcbox: {earlier} holds the results of an earlier job 4242 (Slurm gave its id again): they are "
        "left as they are, and this job stops; move that folder aside and submit again"
    ), output
    after = sorted(
        (path.relative_to(earlier), path.read_bytes()) for path in earlier.rglob("*") if path.is_file()
    )
    assert after == before
    assert not (sandbox.root / "argv.json").exists()  # the program never ran
    # A folder hpcbox did not mark is not taken for this job's either; its own, from its first run, is.
    (earlier / ".hpcbox-submission").unlink()
    assert sandbox.run(script)[0] == 66
    shutil.rmtree(earlier)
    status, output = sandbox.run(script)
    assert status == 0, output
    assert (earlier / ".hpcbox-submission").read_text() == "trainer-20270101T000000-bbbbbbbb.sh\n"
    status, output = sandbox.run(script)  # as its requeue runs it: the same submission
    assert status == 0, output


def test_a_janitor_that_ignores_its_signals_does_not_hold_the_job(sandbox: Sandbox):
    """However the janitor step fails to end, the job script ends: USR2, TERM, then KILL. A janitor
    signalled as it started once slept on, and the job script's `wait` with it (a full run's hang)."""
    stubborn = sandbox.root / "bin" / "srun"
    stubborn.write_text(
        STUB_SRUN.replace(
            "while",
            'if [[ $* == *--job-name=hpcbox-janitor* ]]; then\n    trap "" USR2 TERM\n'
            "    while :; do sleep 0.1; done\nfi\nwhile",
            1,
        )
    )
    started = time.monotonic()
    status, output = sandbox.run(sandbox.script(ResourceRequest(job_name="stubborn")))
    assert status == 0, output
    assert time.monotonic() - started < 30, output
    assert (sandbox.run_dir / "metrics.jsonl").exists()
    assert not sandbox.scratch_was.exists()


def test_checkpointed_trainer_is_requeued_after_copy_back(sandbox: Sandbox):
    status, output = sandbox.run(sandbox.script(ResourceRequest(job_name="ckpt")), mode="checkpoint")
    assert status == 0, output
    assert sandbox.slurm_calls() == ["requeue 4242"]
    assert (sandbox.run_dir / "checkpoints" / "last.pt").read_text() == "SIGUSR1"
    assert not sandbox.scratch_was.exists()


@pytest.mark.parametrize(("restarts_so_far", "requeued"), [(1, True), (2, False)])
def test_a_job_requeues_itself_at_most_max_restarts_times(sandbox: Sandbox, restarts_so_far, requeued):
    again = dataclasses.replace(sandbox, env={**sandbox.env, "SLURM_RESTART_COUNT": str(restarts_so_far)})
    status, output = again.run(
        again.script(ResourceRequest(job_name="bounded", max_restarts=2)), "checkpoint"
    )
    assert sandbox.slurm_calls() == (["requeue 4242"] if requeued else []), output
    if requeued:
        assert status == 0 and "(restart 2 of at most 2)" in output, output
    else:
        assert status == 75, output  # the job ends FAILED with the trainer's "checkpointed" status
        assert "has been requeued 2 times (--max-restarts)" in output and "scontrol requeue 4242" in output
    assert (sandbox.run_dir / "checkpoints" / "last.pt").read_text() == "SIGUSR1"  # copied back either way
    assert not sandbox.scratch_was.exists()


def test_a_job_that_finished_is_not_run_again_when_slurm_starts_it_again(sandbox: Sandbox):
    """Preemption's grace-time trap: Slurm requeues a job it picked even where the job finished in its
    grace time (and `scontrol requeue` takes a finished job). The program does not run twice, and its
    results are not written over; a job whose program failed or checkpointed runs again."""
    script = sandbox.script(ResourceRequest(job_name="once"), ("--epochs", "1"))
    status, output = sandbox.run(script)
    assert status == 0, output
    (sandbox.root / "argv.json").unlink()
    before = {path: path.read_bytes() for path in sandbox.run_dir.rglob("*") if path.is_file()}
    again = dataclasses.replace(sandbox, env={**sandbox.env, "SLURM_RESTART_COUNT": "1"})
    status, output = again.run(script)
    assert status == 0, output
    said = [line for line in output.splitlines() if line.startswith("hpcbox: ")]
    assert said[-1] == (
        "hpcbox: job 4242 finished in an earlier run (exit status 0): it is not run again, and its results "
        f"in {sandbox.run_dir} stay as they are"
    ), output
    assert not (sandbox.root / "argv.json").exists()  # the program never started
    assert {path: path.read_bytes() for path in sandbox.run_dir.rglob("*") if path.is_file()} == before
    assert not sandbox.scratch_was.exists() and sandbox.slurm_calls() == []
    for outcome in ("3\n", "75\n"):  # failed, or checkpointed: the next run is the job's to run
        (sandbox.run_dir / ".hpcbox-exit").write_text(outcome)
        status, output = again.run(script)
        assert status == 0 and (sandbox.root / "argv.json").exists(), output
        (sandbox.root / "argv.json").unlink()


def test_requeued_job_starts_from_the_copied_back_checkpoints(sandbox: Sandbox):
    (sandbox.run_dir / "checkpoints").mkdir(parents=True)
    (sandbox.run_dir / "checkpoints" / "last.pt").write_text("from the first run")
    probe = sandbox.root / "bin" / "apptainer"
    probe.write_text(
        STUB_APPTAINER + "\nassert (out / 'checkpoints' / 'last.pt').read_text() == 'from the first run'\n"
    )
    status, output = sandbox.run(sandbox.script(ResourceRequest(job_name="resume")))
    assert status == 0, output


def _wait_for(path: Path, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_usr1_before_the_time_limit_is_forwarded_and_the_job_requeued(sandbox: Sandbox):
    process = sandbox.start(sandbox.script(ResourceRequest(job_name="usr1", time="30")), mode="wait")
    _wait_for(sandbox.root / "ready")
    process.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@margin does: the batch shell only
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    assert (sandbox.run_dir / "checkpoints" / "last.pt").read_text() == "SIGUSR1"
    assert sandbox.slurm_calls() == ["requeue 4242"]
    assert not sandbox.scratch_was.exists()


def test_usr1_as_the_job_is_picked_where_the_site_sends_it_is_a_preemption_slurm_requeues(sandbox: Sandbox):
    """Where the site sets send_user_signal, the job's own USR1 comes as it is picked for preemption, and
    the job's PreemptTime is set from then on: the trainer checkpoints as at the time limit, but the
    script leaves the requeue to Slurm (a requeue of its own would count its run REQUEUED, not
    PREEMPTED) and says the job was preempted; the next run resumes."""
    sandbox.env["STUB_PREEMPT_TIME"] = "2026-12-06T21:30:00"
    process = sandbox.start(sandbox.script(ResourceRequest(job_name="picked", time="30")), mode="wait")
    _wait_for(sandbox.root / "ready")
    process.send_signal(signal.SIGUSR1)
    output, _ = process.communicate(timeout=30)
    said = output.decode(errors="replace")
    assert process.returncode == 0 and checkpointed_on(sandbox) == "SIGUSR1", said
    assert sandbox.slurm_calls() == [], said
    assert not (sandbox.run_dir / ".hpcbox-exit").exists()
    assert "hpcbox: job 4242 was preempted; the trainer checkpointed" in said, said
    assert not sandbox.scratch_was.exists()


def term_while_training(sandbox: Sandbox, restart_count: str | None, restarts: int) -> tuple[int, str]:
    """TERM to the batch shell of a run whose SLURM_RESTART_COUNT is ``restart_count`` while the trainer
    trains, the job's Restarts being ``restarts``: the script's status and output."""
    if restart_count:
        sandbox.env["SLURM_RESTART_COUNT"] = restart_count
    sandbox.env["STUB_RESTARTS"] = str(restarts)
    process = sandbox.start(sandbox.script(ResourceRequest(job_name="term")), mode="wait")
    _wait_for(sandbox.root / "ready")
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=30)
    assert not sandbox.scratch_was.exists()
    return process.returncode, output.decode(errors="replace")


def checkpointed_on(sandbox: Sandbox) -> str:
    """The signal on which the stand-in trainer checkpointed."""
    return (sandbox.run_dir / "checkpoints" / "last.pt").read_text()


@pytest.mark.parametrize("restart_count", [None, "2"], ids=["first run", "a requeued run"])
def test_scancel_term_checkpoints_cleans_up_and_ends_the_job_cancelled(sandbox: Sandbox, restart_count):
    """A TERM whose job Slurm is not requeueing (its Restarts is the run's own count) is a cancel."""
    status, output = term_while_training(sandbox, restart_count, int(restart_count or 0))
    assert status == 75 and checkpointed_on(sandbox) == "SIGTERM", output
    assert sandbox.slurm_calls() == ["scancel 4242"]


@pytest.mark.parametrize("restart_count", [None, "1"], ids=["first run", "a requeued run"])
def test_a_preemptions_term_checkpoints_and_leaves_the_requeue_to_slurm(sandbox: Sandbox, restart_count):
    """Where the site does not send the user's signal, a preempted job's batch shell hears of it first by
    the TERM at its grace time's end, when Slurm has already decided to requeue it (its Restarts one more
    than the run's count). The trainer is given the time limit's signal and checkpoints, and the results
    go back; the script neither cancels the job, which would cancel the requeue, nor requeues it itself,
    and keeps no outcome: the next run resumes."""
    status, output = term_while_training(sandbox, restart_count, int(restart_count or 0) + 1)
    assert status == 0 and checkpointed_on(sandbox) == "SIGUSR1", output
    assert sandbox.slurm_calls() == [], output
    assert not (sandbox.run_dir / ".hpcbox-exit").exists()
    said = [line for line in output.splitlines() if line.startswith("hpcbox: ")]
    assert said[-1].startswith("hpcbox: job 4242 was preempted; the trainer checkpointed"), output


MULTI_PROCESS = ResourceRequest(job_name="ddp", nodes=2, ntasks_per_node=2, cpus=3, time="30")


def test_multi_process_job_runs_one_torchrun_per_node_with_static_rendezvous(sandbox: Sandbox):
    sandbox.env.update(SLURM_JOB_NODELIST="node[1-2]", SLURM_JOB_NUM_NODES="2")
    status, output = sandbox.run(sandbox.script(MULTI_PROCESS, ("--epochs", "1")))
    assert status == 0, output
    argv = sandbox.recorded_argv
    # The node's index reaches torchrun as its node rank, through --env (so also under --containall).
    assert argv[:3] == ["exec", "--env", "PET_NODE_RANK=0"]
    assert "SLURM_CPUS_PER_TASK=3" in argv  # per trainer process, not the node's 6
    launcher = argv[argv.index("hpctrain.torchrun") - 2 : argv.index("--data-dir")]
    assert launcher == [
        "python", "-m", "hpctrain.torchrun", "--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=static",
        "--master-addr=node1", f"--master-port={20000 + 4242 % 20000}", "-m", "hpctrain", "train",
    ]  # fmt: skip
    assert trainer_argv_tail(argv) == ["--epochs", "1"]
    assert not sandbox.scratch_was.exists()


def test_multi_process_job_sees_the_checkpoints_on_every_node_and_is_requeued(sandbox: Sandbox):
    sandbox.env.update(SLURM_JOB_NODELIST="node[1-2]", SLURM_JOB_NUM_NODES="2")
    (sandbox.run_dir / "checkpoints").mkdir(parents=True)
    (sandbox.run_dir / "checkpoints" / "old.pt").write_text("from the first run")
    status, output = sandbox.run(sandbox.script(MULTI_PROCESS), mode="checkpoint")
    assert status == 0, output
    assert 'on_each_node cp -a "$run_dir/."' in sandbox.script(MULTI_PROCESS).text
    assert sandbox.slurm_calls() == ["requeue 4242"]
    assert (sandbox.run_dir / "checkpoints" / "last.pt").read_text() == "SIGUSR1"


NOT_DDP = ContainerCommand("program", "fit", ("--out", "{output_dir}"), launcher="srun")
SIX_TASKS_ONE_GPU = ResourceRequest(job_name="tasks", partition="gpu", gpus=1, ntasks_per_node=6, cpus=2)


def test_a_program_that_is_not_ddp_runs_once_per_slurm_task(sandbox: Sandbox):
    script = sandbox.script(SIX_TASKS_ONE_GPU, ("--epochs", "1"), NOT_DDP)
    assert "#SBATCH --ntasks-per-node=6\n" in script.text and "#SBATCH --gres=gpu:1\n" in script.text
    assert "srun --nodes=1 --ntasks=6 --ntasks-per-node=6 --cpus-per-task=2 --mem=0" in script.text
    assert "torchrun" not in script.text and "rendezvous" not in script.text
    assert bash_syntax(script.text).returncode == 0
    assert shellcheck(script.text).stdout == ""
    sandbox.env.update(SLURM_PROCID="5", SLURM_LOCALID="5", SLURM_NTASKS="6")
    status, output = sandbox.run(script)
    assert status == 0, output
    argv = sandbox.recorded_argv
    # Each task knows its place in the job, through --env (so also under --containall).
    assert argv[:9] == [
        "exec", "--env", "SLURM_PROCID=5", "--env", "SLURM_LOCALID=5", "--env", "SLURM_NODEID=0",
        "--env", "SLURM_NTASKS=6",
    ]  # fmt: skip
    assert "--nv" in argv and "SLURM_CPUS_PER_TASK=2" in argv
    sif = str(sandbox.submit / "images" / "trainer.sif")
    assert argv[argv.index(sif) + 1 :] == ["fit", "--out", "/scratch/out", "--epochs", "1"]


# Stand-in for `apptainer exec` that runs the command after the SIF here, as the container would.
STUB_APPTAINER_EXEC = r"""#!/usr/bin/env python3
import json, os, pathlib, signal, sys

args = sys.argv[1:]
if args == ["--version"]:  # the job's check that the runtime runs on the node
    sys.exit(print("apptainer version 0 (stand-in)"))
if args[0] == "exec" and args[2:] == ["true"]:  # the job's check that a node can mount the SIF
    if os.environ.get("STUB_USR1_WHILE_STAGING"):  # to the job script, this one's parent's parent
        script = int(pathlib.Path(f"/proc/{os.getppid()}/stat").read_text().rsplit(")", 1)[1].split()[1])
        os.kill(script, signal.SIGUSR1)
    if os.environ.get("STUB_MOUNT_EXTRACTS"):  # Apptainer without squashfuse
        print("INFO:    Converting SIF file to temporary sandbox...", file=sys.stderr)
    sys.exit(int(os.environ.get("STUB_MOUNT_FAILS", "0")))
if args[0] == "build":  # unpacking: the sandbox, a folder holding the SIF's bytes
    pathlib.Path(args[-2]).mkdir()
    pathlib.Path(args[-2], "image").write_bytes(pathlib.Path(args[-1]).read_bytes())
    sys.exit(0)
pathlib.Path(os.environ["STUB_RECORD"]).write_text(json.dumps(args))
scratch = next(a.split(":")[0] for a in args if a.endswith(":/scratch"))
os.environ["STUB_OUT"] = str(pathlib.Path(scratch, "out"))
for option, value in zip(args, args[1:]):
    # As Apptainer sets them in the container; the sandbox's own PYTHONPATH stands in for /code.
    if option == "--env" and not value.startswith("PYTHONPATH="):
        name, _, os.environ[name] = value.partition("=")
command = args[args.index("--pwd") + 3 :]
os.execvp(command[0], command)
"""

# A program that checkpoints on USR1 or TERM, and otherwise runs for a minute.
STUB_PROGRAM = r"""#!/usr/bin/env python3
import os, pathlib, signal, sys, time

out = pathlib.Path(os.environ["STUB_OUT"])

def checkpoint(signum, frame):
    (out / "checkpoints").mkdir(exist_ok=True)
    (out / "checkpoints" / "last.pt").write_text(signal.Signals(signum).name)
    sys.exit(75)

signal.signal(signal.SIGUSR1, checkpoint)
signal.signal(signal.SIGTERM, checkpoint)
pathlib.Path(os.environ["STUB_READY"]).write_text(str(os.getpid()))
time.sleep(60)
sys.exit(9)
"""


def test_usr1_reaches_each_task_of_a_program_that_is_not_ddp(sandbox: Sandbox):
    """The batch shell finds the program's processes by their command line (pkill), not through srun."""
    program = sandbox.root / "bin" / "fit"
    for path, body in ((sandbox.root / "bin" / "apptainer", STUB_APPTAINER_EXEC), (program, STUB_PROGRAM)):
        path.write_text(body)
        path.chmod(0o755)
    command = ContainerCommand("program", str(program), launcher="srun")
    process = sandbox.start(sandbox.script(SIX_TASKS_ONE_GPU, (), command), mode="wait")
    _wait_for(sandbox.root / "ready")
    process.send_signal(signal.SIGUSR1)
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    assert (sandbox.run_dir / "checkpoints" / "last.pt").read_text() == "SIGUSR1"
    assert sandbox.slurm_calls() == ["requeue 4242"]


# A program run by bash: on USR1 it checkpoints and exits 75. So does a decoy of the same user run by
# bash too, which must not hear of it: the batch shell would send itself the signal, and another job's
# processes would checkpoint, were the pattern the only test.
BASH_PROGRAM = """
trap 'echo "$1" >"$STUB_OUT/checkpointed"; kill "$!"; exit 75' USR1
echo "$$" >"$STUB_READY"
sleep 60 >/dev/null &
wait
"""


def test_usr1_reaches_this_jobs_bash_program_and_no_other_process_that_matches(sandbox: Sandbox):
    (sandbox.root / "bin" / "apptainer").write_text(STUB_APPTAINER_EXEC)
    (sandbox.root / "bin" / "apptainer").chmod(0o755)
    decoys = {}
    for name, job in (("other-job", "4243"), ("no-job", None)):
        out = sandbox.root / name
        out.mkdir()
        env = {**sandbox.env, "STUB_OUT": str(out), "STUB_READY": str(out / "ready")}
        env.pop("HPCBOX_JOB", None)
        if job:
            env["HPCBOX_JOB"] = job
        decoys[name] = subprocess.Popen(["bash", "-c", BASH_PROGRAM, "bash", name], env=env)
        _wait_for(out / "ready")
    command = ContainerCommand("program", "bash", ("-c", BASH_PROGRAM, "bash", "mine"), launcher="srun")
    try:
        process = sandbox.start(sandbox.script(SIX_TASKS_ONE_GPU, (), command), mode="wait")
        _wait_for(sandbox.root / "ready")
        process.send_signal(signal.SIGUSR1)
        output, _ = process.communicate(timeout=30)
        assert process.returncode == 0, output
        assert (sandbox.run_dir / "checkpointed").read_text() == "mine\n"
        assert sandbox.slurm_calls() == ["requeue 4242"]
        assert [decoy.poll() for decoy in decoys.values()] == [None, None]
        assert not any((sandbox.root / name / "checkpointed").exists() for name in decoys)
    finally:
        for decoy in decoys.values():
            decoy.kill()
            decoy.wait()


# A project's console entry point, `stubfit.cli:main`: checkpoints on USR1 with the arguments it got.
STUB_ENTRY_POINT_MODULE = r"""
import os, pathlib, signal, sys, time

def main():
    out = pathlib.Path(os.environ["STUB_OUT"])

    def checkpoint(signum, frame):
        (out / "checkpoints").mkdir(exist_ok=True)
        (out / "checkpoints" / "last.pt").write_text(" ".join(sys.argv))
        sys.exit(75)

    signal.signal(signal.SIGUSR1, checkpoint)
    pathlib.Path(os.environ["STUB_READY"]).write_text(str(os.getpid()))
    time.sleep(60)
    return 9
"""


def test_an_entry_point_runs_its_function_with_the_arguments_and_is_found_for_usr1(sandbox: Sandbox):
    package = sandbox.root / "code" / "stubfit"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "cli.py").write_text(STUB_ENTRY_POINT_MODULE)
    (sandbox.root / "bin" / "apptainer").write_text(STUB_APPTAINER_EXEC)
    (sandbox.root / "bin" / "apptainer").chmod(0o755)
    (sandbox.root / "bin" / "python").symlink_to(sys.executable)
    sandbox.env["PYTHONPATH"] = str(package.parent)  # what --env PYTHONPATH=/code is in the container
    command = ContainerCommand("entry_point", "stubfit.cli:main", ("--lr", "it's 0.1"), launcher="srun")
    script = sandbox.script(SIX_TASKS_ONE_GPU, (), command)
    assert shellcheck(script.text).stdout == ""
    process = sandbox.start(script, mode="wait")
    _wait_for(sandbox.root / "ready")
    process.send_signal(signal.SIGUSR1)
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    assert (sandbox.run_dir / "checkpoints" / "last.pt").read_text() == "stubfit.cli --lr it's 0.1"
    assert sandbox.slurm_calls() == ["requeue 4242"]


# A trainer that checkpoints at once, then trains on for a minute; on USR1 it checkpoints again.
STUB_CHECKPOINTING_PROGRAM = r"""#!/usr/bin/env python3
import os, pathlib, signal, sys, time

out = pathlib.Path(os.environ["STUB_OUT"])
(out / "checkpoints").mkdir(parents=True, exist_ok=True)

def save(text):
    partial = out / "checkpoints" / "last.pt.partial"
    partial.write_text(text)
    partial.replace(out / "checkpoints" / "last.pt")  # whole or not at all, as a trainer should

def on_usr1(signum, frame):
    save("epoch 2")
    sys.exit(75)

signal.signal(signal.SIGUSR1, on_usr1)
save("epoch 1")
pathlib.Path(os.environ["STUB_READY"]).write_text(str(os.getpid()))
time.sleep(60)
"""


def test_checkpoints_reach_shared_storage_while_the_job_runs(sandbox: Sandbox):
    """What a node that dies mid-run leaves: the last periodic copy, in the shared run folder."""
    program = sandbox.root / "bin" / "fit"
    for path, body in (
        (sandbox.root / "bin" / "apptainer", STUB_APPTAINER_EXEC),
        (program, STUB_CHECKPOINTING_PROGRAM),
    ):
        path.write_text(body)
        path.chmod(0o755)
    command = ContainerCommand("program", str(program), launcher="srun")
    script = sandbox.script(ResourceRequest(job_name="sync", sync_every="0:05"), (), command)
    assert shellcheck(script.text).stdout == ""
    process = sandbox.start(script, mode="wait")
    _wait_for(sandbox.root / "ready")
    copied = sandbox.run_dir / "checkpoints" / "last.pt"
    _wait_for(copied, timeout_s=15)
    assert process.poll() is None  # the job is still running: this copy is the periodic one
    assert copied.read_text() == "epoch 1"
    assert not list(sandbox.run_dir.glob("**/*.partial"))
    process.send_signal(signal.SIGUSR1)
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    assert copied.read_text() == "epoch 2"  # and the job's end copies the last one over it
    assert sandbox.slurm_calls() == ["requeue 4242"]
    assert list(sandbox.node_scratch.rglob("hpcbox-*")) == []
    assert not Path(f"{sandbox.run_dir}.incoming").exists()


# A program that writes a small file and a big one (sparse: no disk), then, told by a file, changes the
# small one; it ends on TERM.
STUB_WRITING_PROGRAM = r"""#!/usr/bin/env python3
import os, pathlib, signal, sys, time

out = pathlib.Path(os.environ["STUB_OUT"])
(out / "curves").mkdir(parents=True, exist_ok=True)
(out / "curves" / "small.txt").write_text("first")
with open(out / "big.bin", "wb") as big:
    big.truncate(17 * 2**20)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
pathlib.Path(os.environ["STUB_READY"]).write_text(str(os.getpid()))
change = pathlib.Path(os.environ["STUB_READY"]).with_name("change")
while not change.exists():
    time.sleep(0.05)
(out / "curves" / "small.txt").write_text("second")
time.sleep(60)
"""


def test_small_files_that_change_reach_shared_storage_between_the_whole_copies(sandbox: Sandbox):
    """For `hpcbox watch`: a quarter of the way to the next whole copy, the small files that changed
    are in the run folder (and not the big ones), and again as they change."""
    program = sandbox.root / "bin" / "fit"
    for path, body in (
        (sandbox.root / "bin" / "apptainer", STUB_APPTAINER_EXEC),
        (program, STUB_WRITING_PROGRAM),
    ):
        path.write_text(body)
        path.chmod(0o755)
    command = ContainerCommand("program", str(program), launcher="srun")
    script = sandbox.script(ResourceRequest(job_name="live", sync_every="0:40"), (), command)
    assert shellcheck(script.text).stdout == ""
    process = sandbox.start(script, mode="wait")
    try:
        _wait_for(sandbox.root / "ready")
        small = sandbox.run_dir / "curves" / "small.txt"
        _wait_for(small, timeout_s=25)  # the first live copy: 10 s in, where the whole one is 40 s in
        assert small.read_text() == "first" and not (sandbox.run_dir / "big.bin").exists()
        (sandbox.root / "change").write_text("")
        deadline = time.monotonic() + 25
        while small.read_text() != "second":
            assert time.monotonic() < deadline, "the changed file never came"
            time.sleep(0.1)
        assert not (sandbox.run_dir / "big.bin").exists() and process.poll() is None
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert (sandbox.run_dir / "big.bin").stat().st_size == 17 * 2**20, output  # the end's whole copy
    assert not Path(f"{sandbox.run_dir}.recent").exists()


@pytest.mark.parametrize(
    ("given", "seconds"), [(None, 600), ("30:00", 1800), ("0", 0), ("0:00", 0), ("0:05", 5), ("2", 120)]
)
def test_sync_every_is_a_slurm_time_or_zero(given: str | None, seconds: int):
    assert (
        resolve(profiles.load_profile("local"), ResourceRequest(job_name="x", sync_every=given)).sync_every_s
        == seconds
    )


@pytest.mark.parametrize(
    ("given", "says"), [("0:04", "'0:04' is under 5 s"), ("soon", "'soon' is not a Slurm time")]
)
def test_a_bad_sync_every_names_the_field(given: str, says: str):
    with pytest.raises(FieldError) as refused:
        resolve(profiles.load_profile("local"), ResourceRequest(job_name="x", sync_every=given))
    assert refused.value.field == "sync_every" and says in refused.value.message


def test_no_syncer_when_sync_every_is_zero():
    text = render("local", ResourceRequest(job_name="x", sync_every="0")).text
    assert "syncer_pid=$!" not in text and "sleep 600" not in text


def test_a_syncer_that_lost_its_first_term_is_still_stopped_and_the_job_ends(sandbox: Sandbox):
    """A TERM that reaches the syncer as it starts, before its trap is set, is lost (the job was stopped
    while staging: CI saw the job hang for the syncer's whole interval). A syncer that swallows the first
    TERM stands in for it; clean_up's TERM each second ends it."""
    script = sandbox.script(ResourceRequest(job_name="sync"), ("--epochs", "1"))
    start = script.text.index('(\n    stop=""')
    end = script.text.index("syncer_pid=$!")
    stubborn = "(\n    trap 'trap - TERM' TERM\n    while :; do sleep 0.1; done\n) &\n"
    script = dataclasses.replace(script, text=script.text[:start] + stubborn + script.text[end:])
    status, output = sandbox.run(script)
    assert status == 0, output
    assert json.loads((sandbox.run_dir / "metrics.jsonl").read_text()) == {"epoch": 1}
    assert not list(sandbox.node_scratch.rglob("hpcbox-*"))


def test_a_program_that_exits_while_the_signal_is_still_being_passed_on_keeps_its_status(sandbox: Sandbox):
    """The batch shell's `wait` returns 138 when its USR1 trap runs; a program that checkpoints and exits
    before the trap is over must still be seen to exit 75 (and the job requeued), not 138."""
    program = sandbox.root / "bin" / "fit"
    slow_pkill = f'#!/bin/sh\n{shutil.which("pkill")} "$@"\nstatus=$?\nsleep 1\nexit $status\n'
    for path, body in (
        (sandbox.root / "bin" / "apptainer", STUB_APPTAINER_EXEC),
        (program, STUB_PROGRAM),
        (sandbox.root / "bin" / "pkill", slow_pkill),
    ):
        path.write_text(body)
        path.chmod(0o755)
    command = ContainerCommand("program", str(program), launcher="srun")
    process = sandbox.start(sandbox.script(SIX_TASKS_ONE_GPU, (), command), mode="wait")
    _wait_for(sandbox.root / "ready")
    process.send_signal(signal.SIGUSR1)
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    assert b"the trainer exited with status 75" in output or b"requeueing job 4242" in output, output
    assert sandbox.slurm_calls() == ["requeue 4242"]


def test_ddp_processes_that_do_not_match_the_gpus_are_refused_at_render_time():
    """Resources checked for a program that is not DDP cannot be rendered for one that is."""
    profile = profiles.load_profile("local")
    checked = resolve(profile, SIX_TASKS_ONE_GPU, ddp=False)
    with pytest.raises(FieldError) as refused:
        render_sbatch(profile, checked, INPUTS, (), EXAMPLE_TRAINER)
    assert refused.value.field == "ntasks_per_node"
    assert "6 DDP processes per node on 1 GPU per node" in refused.value.message


CONTAINER_OPTIONS = ResourceRequest(
    job_name="own", container="singularity", cleanenv=True, home="/home/me/alt:/home/me",
    bind=("/datasets:/datasets:ro", "/tmp/it's here"),
)  # fmt: skip


def test_a_jobs_container_options_reach_the_runtime(sandbox: Sandbox):
    (sandbox.root / "bin" / "singularity").symlink_to(sandbox.root / "bin" / "apptainer")
    script = sandbox.script(CONTAINER_OPTIONS)
    assert shellcheck(script.text).stdout == ""
    status, output = sandbox.run(script)
    assert status == 0, output
    argv = sandbox.recorded_argv
    before_sif = argv[: argv.index(str(sandbox.submit / "images" / "trainer.sif"))]
    assert before_sif[:4] == ["exec", "--cleanenv", "--home", "/home/me/alt:/home/me"]
    binds = [before_sif[i + 1] for i, word in enumerate(before_sif) if word == "--bind"]
    assert binds[:2] == ["/datasets:/datasets:ro", "/tmp/it's here"]


def test_the_shell_runs_the_same_container_options():
    profile = profiles.load_profile("edi")
    checked = resolve(profile, dataclasses.replace(CONTAINER_OPTIONS, cleanenv=None, no_home=True, home=None))
    words = shlex.split(render_shell(profile, checked, "/h/x.sif", "/h/code").splitlines()[-1])
    assert words[words.index("singularity") : words.index("singularity") + 7] == [
        "singularity", "shell", "--no-home", "--bind", "/datasets:/datasets:ro", "--bind", "/tmp/it's here",
    ]  # fmt: skip


def test_single_process_job_has_no_srun_and_no_torchrun():
    text = render("local", ResourceRequest(job_name="one", nodes=1, ntasks_per_node=1)).text
    assert "hpctrain.torchrun" not in text
    # The one srun is the janitor's, which removes scratch if the script itself is killed.
    [srun] = [line for line in text.splitlines() if line.startswith("srun ") or " srun " in line]
    assert 'bash -c "$janitor" janitor' in srun


NASTY_ARGS = ("--note", "it's $HOME and `date` $(id)", "", "two\nlines", "{output_dir}/best.pt")


@pytest.mark.parametrize(
    ("command", "runs"),
    [
        (ContainerCommand("module", "mypkg.fit", NASTY_ARGS), ["python", "-m", "mypkg.fit"]),
        (ContainerCommand("script", "/code/mypkg/train.py", NASTY_ARGS), ["python", "/code/mypkg/train.py"]),
        (ContainerCommand("program", "fit", NASTY_ARGS), ["fit"]),
    ],
)
def test_configured_command_reaches_the_container_word_for_word(sandbox: Sandbox, command, runs):
    script = sandbox.script(ResourceRequest(job_name="mine"), ("--epochs", "2"), command)
    assert shellcheck(script.text).stdout == ""
    status, output = sandbox.run(script)
    assert status == 0, output
    argv = sandbox.recorded_argv
    in_container = argv[argv.index(str(sandbox.submit / "images" / "trainer.sif")) + 1 :]
    resolved = [*NASTY_ARGS[:-1], "/scratch/out/best.pt"]
    assert in_container == [*runs, *resolved, "--epochs", "2"]


@pytest.mark.parametrize(
    ("command", "launch"),
    [
        (ContainerCommand("module", "mypkg.fit", ("-v",)), "-m mypkg.fit -v"),
        (ContainerCommand("script", "/code/train.py", ("-v",)), "/code/train.py -v"),
        (ContainerCommand("program", "fit", ("-v",)), "--no-python fit -v"),
    ],
)
def test_torchrun_starts_the_configured_command_in_each_process(command, launch):
    profile = profiles.load_profile("local")
    request = ResourceRequest(job_name="mine", nodes=2, ntasks_per_node=2, time="10")
    text = render_sbatch(profile, resolve(profile, request), INPUTS, (), command).text
    one_line = text.replace(" \\\n    ", " ")
    assert f'--master-port="$rendezvous_port" {launch} &\n' in one_line
    assert shellcheck(text).stdout == ""


def test_missing_inputs_fail_early_with_a_clear_line(sandbox: Sandbox):
    (sandbox.submit / "data" / "trainer.tar").unlink()
    status, output = sandbox.run(sandbox.script(ResourceRequest(job_name="nodata")))
    assert status == 66
    assert "trainer.tar does not exist" in output
    assert list((sandbox.node_scratch).rglob("hpcbox-*")) == []


argument_text = st.text(alphabet=st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)))
trainer_args = st.lists(argument_text, max_size=6)
any_names = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=30
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=any_names, args=trainer_args)
def test_arbitrary_job_name_and_arguments_reach_the_trainer_exactly(name: str, args: list[str]):
    with tempfile.TemporaryDirectory() as directory:
        sandbox = make_sandbox(Path(directory))
        try:
            script = sandbox.script(ResourceRequest(job_name=name), tuple(args))
        except FieldError as refused:
            # Only names sbatch cannot carry on one #SBATCH line are refused, and they say so.
            assert refused.field == "job_name"
            assert not name or any(unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp") for char in name)
            return
        assert bash_syntax(script.text).returncode == 0
        status, output = sandbox.run(script)
        assert status == 0, output
        assert trainer_argv_tail(sandbox.recorded_argv) == args


# --- the task ------------------------------------------------------------------------------------


REPO = Path(__file__).resolve().parents[2]


def invoke(*argv: str, cwd: Path, **sbatch_env: str) -> subprocess.CompletedProcess:
    program = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin" / "invoke"
    # sbatch's own variables (SBATCH_ACCOUNT, ...) change what the task renders: only those given.
    env = {name: value for name, value in os.environ.items() if not name.startswith("SBATCH_")}
    env.update(sbatch_env)
    return subprocess.run(
        [str(program), "--search-root", str(REPO), *argv], cwd=cwd, capture_output=True, text=True, env=env
    )


def test_invoke_sbatch_passes_the_trainer_arguments_word_for_word(tmp_path: Path):
    # Words a shell would split, quote or expand, as values of the trainer's options (which it takes).
    args = [
        "--output-dir",
        "two words",
        "--pretrained-weights",
        "it's",
        "--data-dir=$HOME",
        "--pretrained-weights",
        "",
    ]
    done = invoke("sbatch", "--cluster=local", "--gpus", "1", "--", *args, cwd=REPO)
    assert done.returncode == 0, done.stderr
    # This repository's [tool.hpcbox.resources.local] under the flags, as the task reads it.
    request = request_for("local", {"gpus": "1"}, REPO / "pyproject.toml", "trainer")
    assert request.mem, "the example trainer's own request for the local cluster"
    expected = render("local", request, args=args, inputs=JobInputs.defaults("trainer"))
    assert done.stdout == expected.text


def test_invoke_sbatch_takes_the_account_from_the_environment_unless_a_flag_names_one():
    def account_lines(*flags: str) -> list[str]:
        done = invoke("sbatch", "--cluster=m3", *flags, cwd=REPO, SBATCH_ACCOUNT="lab01")
        assert done.returncode == 0, done.stderr
        return [line for line in done.stdout.splitlines() if line.startswith("#SBATCH --account")]

    assert account_lines() == ["#SBATCH --account=lab01"]  # m3 requires one: the environment gives it
    assert account_lines("--account", "mine") == ["#SBATCH --account=mine"]


def test_invoke_sbatch_writes_the_script_with_save_and_o_is_the_jobs_log_as_in_sbatch(tmp_path: Path):
    target = tmp_path / "job.sh"
    done = invoke("sbatch", "--cluster=edi", "--save", str(target), "-o", "logs/%x-%j.log", cwd=REPO)
    assert done.returncode == 0, done.stderr
    script = target.read_text()
    assert script.startswith("#!/bin/bash\n#SBATCH --job-name=trainer\n#SBATCH --partition=PGR-Standard")
    assert "\n#SBATCH --output=logs/%x-%j.log\n" in script


@pytest.mark.parametrize(
    ("time", "error"),
    [
        (
            "8-00:00:00",
            "time: 8-00:00:00 exceeds the limit of partition 'PGR-Standard' (allowed: up to 7-00:00:00)",
        ),
        (
            "0:00",
            "time: '0:00' is zero, which Slurm reads as no limit (allowed: a positive time, e.g. 1:30:00)",
        ),
    ],
)
def test_invoke_sbatch_refuses_bad_input_in_one_line_and_writes_nothing(tmp_path: Path, time, error):
    target = tmp_path / "job.sh"
    done = invoke("sbatch", "--cluster=edi", "--time", time, "-o", str(target), cwd=REPO)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"error: {error}"]
    assert not target.exists()
    assert done.stdout == ""


def test_shell_is_an_srun_allocation_running_apptainer_with_the_code_bound():
    profile = profiles.load_profile("edi")
    checked = resolve(profile, ResourceRequest(job_name="dbg", gpus=1, time="30"))
    interactive = render_shell(profile, checked, "/h/images/x.sif", "/h/code/abc")
    one_off = render_shell(profile, checked, "/h/images/x.sif", "/h/code/abc", "nvidia-smi; it's")
    for text in (interactive, one_off):
        assert subprocess.run(["bash", "-n", "-c", text], check=False).returncode == 0
    last = shlex.split(interactive.splitlines()[-1])
    assert last[0] == "srun" and "--pty" in last and "--gres=gpu:1" in last and "--time=00:30:00" in last
    assert last[last.index("--nv") - 1] == "shell"
    assert last[-5:] == ["--bind", "/h/code/abc:/code:ro", "--env", "PYTHONPATH=/code", "/h/images/x.sif"]
    assert shlex.split(one_off.splitlines()[-1])[-3:] == ["bash", "-c", "nvidia-smi; it's"]
    assert "--pty" not in one_off


# Stand-in for cp that is cut short while copying results back (as KillWait's SIGKILL would cut it):
# half of each file lands in the staging folder, then it fails. Every other copy is the real cp.
STUB_CP_CUT_SHORT = """#!/bin/bash
destination=${!#}
if [[ $destination == *.incoming/ ]]; then
    for file in "${@: -2:1}"/*; do
        [[ -f $file ]] && head -c 3 "$file" >"$destination/$(basename "$file")"
    done
    exit 1
fi
exec /bin/cp "$@"
"""


def test_a_copy_back_cut_short_leaves_the_earlier_results_whole(tmp_path: Path):
    sandbox = make_sandbox(tmp_path)
    sandbox.run_dir.mkdir(parents=True)
    (sandbox.run_dir / "metrics.jsonl").write_text('{"epoch": 0}\n')  # what an earlier run copied back
    stub = sandbox.root / "bin" / "cp"
    stub.write_text(STUB_CP_CUT_SHORT)
    stub.chmod(0o755)
    status, output = sandbox.run(sandbox.script(ResourceRequest(job_name="cut")), "ok")
    assert status == 0, output
    assert f"copying results to {sandbox.run_dir} failed" in output
    # The new metrics never replaced the earlier file half-written: renames only follow a whole copy.
    assert (sandbox.run_dir / "metrics.jsonl").read_text() == '{"epoch": 0}\n'
    assert sorted(p.name for p in sandbox.run_dir.iterdir()) == ["metrics.jsonl"]
    assert not Path(f"{sandbox.run_dir}.incoming").exists()  # no half copy left beside them


# The first copy into the incoming folder meets a file that vanished under it (a checkpoint's temporary
# file, removed as a cancelled trainer stops), as cp does: the rest copied, the status 1; later ones find
# the folder settled.
STUB_CP_VANISHING_ONCE = """#!/bin/bash
destination=${!#}
if [[ $destination == *.incoming/ && ! -e $STUB_CP_MET ]]; then
    touch "$STUB_CP_MET"
    /bin/cp -a "$@"
    echo "cp: cannot stat 'out/checkpoints/.last.pt.x1y2.tmp': No such file or directory" >&2
    exit 1
fi
exec /bin/cp "$@"
"""


def test_a_file_that_vanishes_under_the_copy_back_costs_a_second_copy_not_the_results(tmp_path: Path):
    sandbox = make_sandbox(tmp_path)
    stub = sandbox.root / "bin" / "cp"
    stub.write_text(STUB_CP_VANISHING_ONCE)
    stub.chmod(0o755)
    sandbox.env["STUB_CP_MET"] = str(sandbox.root / "cp-met")
    status, output = sandbox.run(sandbox.script(ResourceRequest(job_name="vanish")), "ok")
    assert status == 0, output
    assert "hpcbox: the results changed while being copied; copying them again" in output
    assert "failed" not in output
    assert (sandbox.run_dir / "metrics.jsonl").is_file(), output
    assert not Path(f"{sandbox.run_dir}.incoming").exists()


# --- the SIF on node scratch ---------------------------------------------------------------------

# Records each srun's options, then runs the command as node 0 (the stand-in cluster has one node).
STUB_SRUN_RECORDING = """#!/bin/bash
printf '%s\\n' "$*" >>"$STUB_SRUN_LOG"
while [[ $1 == --* ]]; do shift; done
SLURM_NODEID=0 exec "$@"
"""

# What `apptainer exec` was given as its image, and that the file was there, whole, while it ran.
SIF_PROBE = """
image = next(a for a in args if a.endswith(".sif"))
pathlib.Path(os.environ["STUB_SIF_SEEN"]).write_text(image + "\\n" + pathlib.Path(image).read_text())
"""


def sif_sandbox(sandbox: Sandbox) -> Sandbox:
    (sandbox.root / "bin" / "apptainer").write_text(STUB_APPTAINER + SIF_PROBE)
    (sandbox.root / "bin" / "srun").write_text(STUB_SRUN_RECORDING)
    sandbox.env.update(STUB_SIF_SEEN=str(sandbox.root / "sif-seen"), STUB_SRUN_LOG=str(sandbox.root / "srun"))
    return sandbox


def test_the_sif_is_copied_to_node_scratch_and_apptainer_runs_the_copy(sandbox: Sandbox):
    sif_sandbox(sandbox)
    script = sandbox.script(ResourceRequest(job_name="copy", sif_on_scratch=True), ("--epochs", "1"))
    assert shellcheck(script.text).stdout == ""
    status, output = sandbox.run(script)
    assert status == 0, output
    image, content = (sandbox.root / "sif-seen").read_text().split("\n", 1)
    assert Path(image) == sandbox.scratch_was / "sif" / "trainer.sif"
    assert content == "not really a SIF"  # the shipped SIF's bytes, on node scratch
    assert f"each node runs its copy of the SIF, {image}" in output
    assert not sandbox.scratch_was.exists()  # cleaning scratch took the copy with it
    assert trainer_argv_tail(sandbox.recorded_argv) == ["--epochs", "1"]


def test_without_the_option_apptainer_runs_the_shipped_sif():
    text = render("local", ResourceRequest(job_name="j")).text
    assert 'cp -- "$sif"' not in text and "copy of the SIF" not in text


def run_image(argv: list[str]) -> str:
    """The image `apptainer exec` ran: the word after `--pwd DIR`."""
    return argv[argv.index("--pwd") + 2]


def test_a_node_that_cannot_mount_the_sif_runs_it_unpacked_on_its_scratch(sandbox: Sandbox):
    sandbox.env["STUB_MOUNT_FAILS"] = "1"
    script = sandbox.script(ResourceRequest(job_name="unpack"), ("--epochs", "1"))
    status, output = sandbox.run(script)
    assert status == 0, output
    assert Path(run_image(sandbox.recorded_argv)) == sandbox.scratch_was / "sif" / "unpacked"
    assert "hpcbox: a node cannot run the SIF as it is" in output
    assert f"each node runs the SIF unpacked on its scratch, {sandbox.scratch_was}/sif/unpacked (" in output
    assert not sandbox.scratch_was.exists()  # the unpacked image goes with scratch


def test_a_node_whose_apptainer_would_extract_the_sif_for_each_process_unpacks_it_once(sandbox: Sandbox):
    """Apptainer without squashfuse runs a SIF by extracting it whole to a temporary folder, for every
    process it starts: the try succeeds, and its message says so."""
    sandbox.env["STUB_MOUNT_EXTRACTS"] = "1"
    status, output = sandbox.run(sandbox.script(ResourceRequest(job_name="extracts"), ("--epochs", "1")))
    assert status == 0, output
    assert Path(run_image(sandbox.recorded_argv)) == sandbox.scratch_was / "sif" / "unpacked"
    assert "hpcbox: a node cannot mount the SIF (Apptainer extracts it for each process)" in output


def test_a_notebook_job_runs_jupyterlab_with_a_token_made_on_its_node_and_shown_nowhere(sandbox: Sandbox):
    script = sandbox.script(ResourceRequest(job_name="nb"), (), command=NOTEBOOK)
    assert shellcheck(script.text).stdout == ""
    status, output = sandbox.run(script)
    assert status == 0, output
    argv = sandbox.recorded_argv
    assert argv[argv.index(str(sandbox.submit / "images" / "trainer.sif")) + 1 :] == [
        "jupyter-lab", "--no-browser", "--ServerApp.root_dir=/scratch",
        "--FileContentsManager.preferred_dir=/scratch/out",
    ]  # fmt: skip
    handed = json.loads((sandbox.root / "notebook.json").read_text())
    assert 20000 <= int(handed["APPTAINERENV_JUPYTER_PORT"]) < 50000
    token = handed["APPTAINERENV_JUPYTER_TOKEN"]
    assert len(token) == 48 and int(token, 16) >= 0  # 24 random bytes, in hex
    assert handed["mode"] == "0o700"  # the runtime folder, which will hold the token: yours alone
    # It listens on the node's own address (its Slurm name), where the login node's forward reaches it.
    assert handed["config"] == {"ServerApp": {"ip": "node1"}}  # the sandbox's SLURMD_NODENAME
    assert token not in script.text and token not in output and token not in " ".join(argv)
    again = sandbox.script(ResourceRequest(job_name="nb", container="singularity"), (), command=NOTEBOOK)
    assert "SINGULARITYENV_JUPYTER_TOKEN=$(od" in again.text and "APPTAINERENV_" not in again.text


def test_a_node_that_mounts_the_sif_runs_the_shipped_one(sandbox: Sandbox):
    status, output = sandbox.run(sandbox.script(ResourceRequest(job_name="mounted"), ("--epochs", "1")))
    assert status == 0, output
    assert run_image(sandbox.recorded_argv) == str(sandbox.submit / "images" / "trainer.sif")
    assert "unpacked" not in output and "cannot run the SIF" not in output


@pytest.mark.parametrize(
    ("fuse", "request_unpack", "tries", "unpacks"),
    [
        (None, None, True, True),  # not known: each node tries, and unpacks where one cannot mount it
        (False, None, False, True),  # no FUSE at the site: unpacked without trying
        (True, None, False, False),  # FUSE known: the SIF as it is, no try
        (True, True, False, True),  # the job's own --unpack-sif wins
        (None, False, False, False),
    ],
)
def test_the_profiles_fuse_and_the_jobs_unpack_sif_decide_whether_nodes_try_or_unpack(
    fuse, request_unpack, tries, unpacks
):
    local = profiles.load_profile("local")
    profile = dataclasses.replace(local, apptainer=dataclasses.replace(local.apptainer, fuse=fuse))
    checked = resolve(profile, ResourceRequest(job_name="j", unpack_sif=request_unpack))
    text = render_sbatch(profile, checked, JobInputs.defaults("trainer")).text
    assert ('tried=$(on_each_node apptainer exec "$sif" true 2>&1)' in text) == tries
    assert ("--sandbox" in text) == unpacks
    assert ("unpack=1\n" in text and 'unpack=""' not in text) == (unpacks and not tries)
    assert shellcheck(text).stdout == ""


def test_a_time_limit_signal_while_the_job_stages_requeues_it_without_starting_the_trainer(sandbox: Sandbox):
    sandbox.env["STUB_USR1_WHILE_STAGING"] = "1"  # USR1 arrives as the nodes try the SIF
    status, output = sandbox.run(sandbox.script(ResourceRequest(job_name="early"), ("--epochs", "1")))
    assert status == 0, output
    assert "hpcbox: the time limit is near; the trainer runs when the job is requeued" in output
    assert not (sandbox.root / "argv.json").exists()  # the trainer never started
    assert sandbox.slurm_calls() == ["requeue 4242"]
    assert not list(sandbox.node_scratch.rglob("hpcbox-*"))


def test_a_runtime_the_node_does_not_have_stops_the_job_before_anything_is_staged(sandbox: Sandbox):
    assert shutil.which("singularity") is None  # neither here nor in the sandbox's bin
    script = sandbox.script(ResourceRequest(job_name="rt", container="singularity"), ("--epochs", "1"))
    status, output = sandbox.run(script)
    assert status == 69, output
    assert "hpcbox: `singularity` does not run on" in output and "[apptainer] command" in output
    assert not (sandbox.root / "argv.json").exists()  # no apptainer ran
    assert not list(sandbox.node_scratch.rglob("hpcbox-*"))  # and no scratch was made


def test_each_node_of_a_multi_node_job_copies_the_sif_once(sandbox: Sandbox):
    sif_sandbox(sandbox)
    sandbox.env.update(SLURM_JOB_NODELIST="node[1-2]", SLURM_JOB_NUM_NODES="2")
    script = sandbox.script(dataclasses.replace(MULTI_PROCESS, sif_on_scratch=True))
    assert shellcheck(script.text).stdout == ""
    status, output = sandbox.run(script)
    assert status == 0, output
    shipped = sandbox.submit / "images" / "trainer.sif"
    copies = [line for line in (sandbox.root / "srun").read_text().splitlines() if " cp -- " in line]
    per_node = "--nodes=2 --ntasks=2 --ntasks-per-node=1 --overlap --mem=0"
    assert copies == [f"{per_node} cp -- {shipped} {sandbox.scratch_was}/sif/"]
    image = (sandbox.root / "sif-seen").read_text().split("\n", 1)[0]
    assert Path(image) == sandbox.scratch_was / "sif" / "trainer.sif"  # what every node's torchrun runs


# --- several steps in one job --------------------------------------------------------------------

# A step (run by STUB_APPTAINER_EXEC, as the container would): logs its name and arguments to
# steps.log in the output folder, shows what an earlier step wrote there, and acts as $STUB_<NAME> says.
STUB_STEP = r"""#!/usr/bin/env python3
import os, pathlib, signal, sys, time

name = pathlib.Path(sys.argv[0]).name
out = pathlib.Path(os.environ["STUB_OUT"])
earlier = (out / "steps.log").read_text().split() if (out / "steps.log").exists() else []
with open(out / "steps.log", "a") as log:
    log.write(f"{name} {' '.join(sys.argv[1:])} (saw {','.join(earlier[:1]) or 'nothing'})\n")
mode = os.environ.get(f"STUB_{name.upper()}", "ok")
if mode == "fail":
    sys.exit(3)
if mode == "checkpoint":
    sys.exit(75)
if mode == "finish-on-usr1":
    signal.signal(signal.SIGUSR1, lambda *_: sys.exit(0))
    pathlib.Path(os.environ["STUB_READY"]).write_text(str(os.getpid()))
    time.sleep(60)
    sys.exit(9)
"""


def steps_sandbox(sandbox: Sandbox) -> Steps:
    """Train then evaluate, as programs on the stand-in's PATH."""
    (sandbox.root / "bin" / "apptainer").write_text(STUB_APPTAINER_EXEC)
    for name in ("train", "evaluate"):
        (sandbox.root / "bin" / name).write_text(STUB_STEP)
        (sandbox.root / "bin" / name).chmod(0o755)
    train = ContainerCommand("program", str(sandbox.root / "bin" / "train"), ("--out", "{output_dir}"))
    evaluate = ContainerCommand("program", str(sandbox.root / "bin" / "evaluate"), ("it's $HOME",))
    return Steps((Step("train", train), Step("evaluate", evaluate)))


def steps_log(sandbox: Sandbox) -> list[str]:
    log = sandbox.run_dir / "steps.log"
    return log.read_text().splitlines() if log.exists() else []


def markers(sandbox: Sandbox) -> list[str]:
    folder = sandbox.run_dir / ".hpcbox-steps"
    return sorted(path.name for path in folder.iterdir()) if folder.exists() else []


def test_steps_run_in_order_and_the_second_sees_what_the_first_wrote(sandbox: Sandbox):
    script = sandbox.script(ResourceRequest(job_name="steps"), (), steps_sandbox(sandbox))
    assert shellcheck(script.text).stdout == ""
    status, output = sandbox.run(script)
    assert status == 0, output
    assert steps_log(sandbox) == ["train --out /scratch/out (saw nothing)", "evaluate it's $HOME (saw train)"]
    assert markers(sandbox) == ["step-1", "step-2"]
    assert output.index("step 1 of 2 (train) starts") < output.index("step 2 of 2 (evaluate) starts")
    assert list(sandbox.node_scratch.rglob("hpcbox-*")) == []


def test_a_step_argument_holding_a_newline_reaches_the_step_as_written(sandbox: Sandbox):
    steps = steps_sandbox(sandbox)
    evaluate = dataclasses.replace(steps.steps[1].command, args=("line one\n  line two",))
    steps = Steps((steps.steps[0], Step("evaluate", evaluate)))
    status, output = sandbox.run(sandbox.script(ResourceRequest(job_name="steps"), (), steps))
    assert status == 0, output
    assert "evaluate line one\n  line two (saw train)\n" in (sandbox.run_dir / "steps.log").read_text()


def test_a_failed_step_stops_the_job_with_its_status(sandbox: Sandbox):
    script = sandbox.script(ResourceRequest(job_name="steps"), (), steps_sandbox(sandbox))
    sandbox.env["STUB_TRAIN"] = "fail"
    status, output = sandbox.run(script)
    assert status == 3, output
    assert steps_log(sandbox) == ["train --out /scratch/out (saw nothing)"]  # evaluate never ran
    assert markers(sandbox) == []
    assert sandbox.slurm_calls() == []
    assert list(sandbox.node_scratch.rglob("hpcbox-*")) == []


def test_a_requeued_job_skips_the_steps_that_finished(sandbox: Sandbox):
    """The first run: train checkpoints at the time limit; the job requeues. The second run finishes
    train, then evaluate fails; requeued by hand, the third run skips train and evaluates."""
    script = sandbox.script(ResourceRequest(job_name="steps"), (), steps_sandbox(sandbox))
    sandbox.env["STUB_TRAIN"] = "checkpoint"
    status, output = sandbox.run(script)
    assert (status, sandbox.slurm_calls(), markers(sandbox)) == (0, ["requeue 4242"], []), output
    sandbox.env.update(STUB_TRAIN="ok", STUB_EVALUATE="fail", SLURM_RESTART_COUNT="1")
    status, output = sandbox.run(script)
    assert (status, markers(sandbox)) == (3, ["step-1"]), output
    sandbox.env.update(STUB_EVALUATE="ok", SLURM_RESTART_COUNT="2")
    status, output = sandbox.run(script)
    assert status == 0, output
    assert "step 1 of 2 (train) finished in an earlier run of this job; skipping it" in output
    assert [line.split()[0] for line in steps_log(sandbox)] == ["train", "train", "evaluate", "evaluate"]
    assert markers(sandbox) == ["step-1", "step-2"]


def test_near_the_time_limit_the_next_step_waits_for_the_requeued_job(sandbox: Sandbox):
    """USR1 comes while train runs; train finishes anyway: evaluate would not have the time it needs."""
    script = sandbox.script(ResourceRequest(job_name="steps", time="30"), (), steps_sandbox(sandbox))
    sandbox.env["STUB_TRAIN"] = "finish-on-usr1"
    process = sandbox.start(script, "ok")
    _wait_for(sandbox.root / "ready")
    process.send_signal(signal.SIGUSR1)
    output, _ = process.communicate(timeout=30)
    text = output.decode()
    assert process.returncode == 0, text
    assert "the time limit is near; step 2 of 2 (evaluate) runs when the job is requeued" in text
    assert sandbox.slurm_calls() == ["requeue 4242"]
    assert markers(sandbox) == ["step-1"] and len(steps_log(sandbox)) == 1


def test_steps_take_no_arguments_from_the_command_line(sandbox: Sandbox):
    with pytest.raises(FieldError) as refused:
        sandbox.script(ResourceRequest(job_name="steps"), ("--epochs", "1"), steps_sandbox(sandbox))
    assert refused.value.field == "trainer_args"
    assert "the job runs 2 steps, each with the args of its [[tool.hpcbox.run.steps]] table" in str(
        refused.value
    )


@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_several_processes_run_each_step_in_turn(launcher: str):
    profile = profiles.load_profile("local")
    steps = Steps(
        (
            Step("train", ContainerCommand("module", "mypkg.fit", ("--out", "{output_dir}"), launcher)),
            Step("evaluate", ContainerCommand("program", "ev", (), launcher)),
        )
    )
    request = ResourceRequest(job_name="s", nodes=2, ntasks_per_node=2, time="10")
    text = render_sbatch(profile, resolve(profile, request, ddp=steps.ddp), INPUTS, (), steps).text
    assert shellcheck(text).stdout == ""
    assert text.count("rendezvous_port=") == (1 if launcher == "torchrun" else 0)  # set up once
    one_line = re.sub(r" \\\n +", " ", text)
    if launcher == "torchrun":
        assert '"$rendezvous_port" -m mypkg.fit --out /scratch/out &' in one_line
        assert '"$rendezvous_port" --no-python ev &' in one_line
    else:
        assert '--pwd /scratch "$sif" python -m mypkg.fit --out /scratch/out &' in one_line
        assert steps.process_pattern() in text.replace("\\\n", "")  # USR1 and TERM reach either step


# --- sweeps --------------------------------------------------------------------------------------

SWEEP = Sweep("sweep.toml", (("--lr", "0.1"), ("--lr", "0.01", "--note", "it's $HOME"), ()), throttle=2)


@pytest.mark.parametrize("task", [0, 1, 2])
def test_an_array_task_runs_its_sweep_point_after_the_jobs_own_arguments(sandbox: Sandbox, task: int):
    script = sandbox.script(
        ResourceRequest(job_name="sweep", array=SWEEP.array()), ("--epochs", "2"), sweep=SWEEP
    )
    assert "#SBATCH --array=0-2%2" in script.text
    assert shellcheck(script.text).stdout == ""
    sandbox.env.update(SLURM_ARRAY_JOB_ID="4240", SLURM_ARRAY_TASK_ID=str(task))
    status, output = sandbox.run(script)
    assert status == 0, output
    assert trainer_argv_tail(sandbox.recorded_argv) == ["--epochs", "2", *SWEEP.points[task]]
    # each task its own run folder, under the array's
    assert (sandbox.submit / "runs" / "4240" / str(task) / "metrics.jsonl").is_file()


def test_an_array_task_outside_the_sweep_stops_before_anything_runs(sandbox: Sandbox):
    script = sandbox.script(ResourceRequest(job_name="sweep", array=SWEEP.array()), (), sweep=SWEEP)
    sandbox.env.update(SLURM_ARRAY_JOB_ID="4240", SLURM_ARRAY_TASK_ID="7")
    status, output = sandbox.run(script)
    assert status == 64
    assert "array task 7 is not one of the sweep's 3 points" in output
    assert not (sandbox.root / "record").exists()


def test_a_sweep_refuses_steps_and_tasks_it_does_not_have():
    profile = profiles.load_profile("local")
    steps = Steps((Step("a", ContainerCommand("module", "a")), Step("b", ContainerCommand("module", "b"))))
    with pytest.raises(FieldError, match="the job runs steps"):
        render_sbatch(
            profile, resolve(profile, ResourceRequest(job_name="x", array="0-2")), INPUTS, (), steps, SWEEP
        )
    with pytest.raises(FieldError) as refused:
        render_sbatch(
            profile, resolve(profile, ResourceRequest(job_name="x", array="1,5")), INPUTS, (), sweep=SWEEP
        )
    assert refused.value.field == "array" and "'1,5' names tasks the sweep sweep.toml does not have" in str(
        refused.value
    )
    resubmission = resolve(profile, ResourceRequest(job_name="x", array="0,2%2"))
    assert "#SBATCH --array=0,2%2" in render_sbatch(profile, resubmission, INPUTS, (), sweep=SWEEP).text
