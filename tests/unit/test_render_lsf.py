"""The bsub job script for LSF sites (dtu): its #BSUB header, what LSF cannot be asked, and the shared
body's traps run with LSF's variables.

The behaviour tests run the real script with bash here, as tests/unit/test_render.py does for Slurm's,
with the variables LSF sets for a job (LSB_JOBID, LSB_JOBINDEX, LS_SUBCWD, LSB_HOSTS, ...) and a
stand-in `brequeue` on PATH. There is no LSF in the mini cluster: nothing here submits to one.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
from pathlib import Path

import pytest

from hpcbox.render import profiles
from hpcbox.render.bsub import memory_per_slot, render_bsub, run_limit
from hpcbox.render.resources import FieldError, ResourceRequest, resolve
from hpcbox.render.sbatch import JobInputs, JobScript
from tests.unit.test_render import (
    REPO,
    Sandbox,
    _wait_for,
    bash_syntax,
    invoke,
    make_sandbox,
    shellcheck,
)

DTU = profiles.load_profile("dtu")
ONE_GPU = ResourceRequest(job_name="digits", partition="gpuv100", gpus=1, cpus=4, mem="16G", time="2:00:00")

STUB_BREQUEUE = """#!/bin/sh
echo "$@" >>"$STUB_BREQUEUE_LOG"
"""


def header(request: ResourceRequest) -> list[str]:
    script = render_bsub(DTU, resolve(DTU, request), JobInputs.defaults("trainer"))
    return [line for line in script.text.splitlines() if line.startswith("#BSUB")]


def refusal(request: ResourceRequest, *, ddp: bool = True) -> FieldError:
    with pytest.raises(FieldError) as refused:
        render_bsub(DTU, resolve(DTU, request, ddp=ddp), JobInputs.defaults("trainer"))
    return refused.value


# --- the header ----------------------------------------------------------------------------------


def test_a_one_gpu_job_asks_lsf_for_its_queue_slots_memory_time_and_gpu():
    assert header(ONE_GPU) == [
        "#BSUB -J digits",
        "#BSUB -q gpuv100",
        "#BSUB -n 4",
        '#BSUB -R "span[hosts=1]"',
        '#BSUB -R "rusage[mem=4GB]"',
        "#BSUB -M 4GB",
        "#BSUB -W 2:00",
        "#BSUB -o logs/digits-%J.out",
        '#BSUB -gpu "num=1:mode=exclusive_process"',
        "#BSUB -wa USR1",
        "#BSUB -wt 5",
        "#BSUB -r",
    ]


@pytest.mark.parametrize(
    ("time", "limit"),
    [("10", "0:10"), ("0:30", "0:01"), ("1:00:00", "1:00"), ("59:59", "1:00"), ("1-00:00:00", "24:00"),
     ("1:30:01", "1:31")],
)  # fmt: skip
def test_the_run_limit_is_hours_and_minutes_rounded_up(time: str, limit: str):
    resources = resolve(DTU, ResourceRequest(job_name="j", time=time))
    assert run_limit(resources.time_s) == limit
    assert f"#BSUB -W {limit}" in header(ResourceRequest(job_name="j", time=time))


@pytest.mark.parametrize(
    ("request_", "per_slot"),
    [
        (ResourceRequest(job_name="j", mem="16G"), "16GB"),  # one slot: the whole node's memory
        (ResourceRequest(job_name="j", mem="16G", cpus=4), "4GB"),
        (ResourceRequest(job_name="j", partition="gpua100", gpus=2, cpus=3, mem="12G"), "2GB"),  # 6 slots
        (ResourceRequest(job_name="j", mem="10G", cpus=3), "3414MB"),  # rounded up, never below the ask
        (ResourceRequest(job_name="j", mem="500M", cpus=2), "250MB"),
    ],
)
def test_memory_per_node_becomes_lsfs_memory_per_slot(request_: ResourceRequest, per_slot: str):
    assert memory_per_slot(resolve(DTU, request_)) == per_slot
    lines = header(request_)
    assert f'#BSUB -R "rusage[mem={per_slot}]"' in lines and f"#BSUB -M {per_slot}" in lines


def test_no_memory_asked_writes_no_rusage_and_no_limit():
    lines = header(ResourceRequest(job_name="j"))
    assert not any("rusage" in line or line.startswith("#BSUB -M") for line in lines)


def test_gpus_per_host_in_exclusive_process_mode_and_none_for_cpu_jobs():
    assert '#BSUB -gpu "num=2:mode=exclusive_process"' in header(
        ResourceRequest(job_name="j", partition="gpua40", gpus=2)
    )
    cpu = render_bsub(DTU, resolve(DTU, ResourceRequest(job_name="j")), JobInputs.defaults("trainer")).text
    assert "-gpu" not in cpu and "--nv" not in cpu and "nvidia-smi" not in cpu


def test_an_array_logs_per_task_and_names_the_task_to_requeue():
    script = render_bsub(
        DTU,
        resolve(DTU, ResourceRequest(job_name="digits sweep", array="1-7:2,9%2")),
        JobInputs.defaults("t"),
    )
    assert "#BSUB -J digits_sweep[1-7:2,9]%2" in script.text
    assert "#BSUB -o logs/digits_sweep-%J_%I.out" in script.text
    assert 'job_key="${LSB_JOBID}_${LSB_JOBINDEX}"' in script.text
    assert 'brequeue "${LSB_JOBID}[${LSB_JOBINDEX}]"' in script.text


def test_the_jobs_own_logs_take_lsfs_patterns():
    lines = header(ResourceRequest(job_name="fit", log="out/%x/%j.log", error_log="out/%x/%j.err"))
    assert "#BSUB -o out/fit/%J.log" in lines and "#BSUB -e out/fit/%J.err" in lines


def test_mail_at_the_start_and_the_end_as_lsf_sends_it():
    at_the_end = header(ResourceRequest(job_name="j", mail_user="s1@dtu.dk"))
    assert "#BSUB -u s1@dtu.dk" in at_the_end and "#BSUB -N" in at_the_end and "#BSUB -B" not in at_the_end
    both = header(ResourceRequest(job_name="j", mail_user="s1@dtu.dk", mail_type="BEGIN,END"))
    assert "#BSUB -B" in both and "#BSUB -N" in both


@pytest.mark.parametrize(
    ("request_", "field", "says"),
    [
        (ResourceRequest(job_name="j", nodes=2), "nodes", "one-node jobs (allowed: 1)"),
        (ResourceRequest(job_name="j", qos="high"), "qos", "uses LSF, which has no QOS"),
        (ResourceRequest(job_name="j", partition="gpua100", gpus=1, gpu_type="a100"), "gpu_type",
         "the queue decides the GPU model"),
        (ResourceRequest(job_name="j", extra=("--exclusive",)), "extra", "sbatch options"),
        (ResourceRequest(job_name="j", mail_type="REQUEUE"), "mail_type", "start and end only"),
        (ResourceRequest(job_name="j", log="logs/%u-%j.out"), "log", "%u has no LSF equivalent"),
        (ResourceRequest(job_name="j", array="0-3"), "array", "LSF array indices start at 1"),
        (ResourceRequest(job_name="j", partition="gpuv100", time="1-00:00:01"), "time",
         "exceeds the limit of queue 'gpuv100' (allowed: up to 1-00:00:00)"),
        (ResourceRequest(job_name="j", partition="gpu"), "partition", "is not a queue of cluster 'dtu'"),
        (ResourceRequest(job_name="j", gpus=1), "gpus", "per node of queue 'hpc' (allowed: 0-0)"),
    ],
)  # fmt: skip
def test_what_lsf_cannot_be_asked_is_refused_naming_the_field(request_, field: str, says: str):
    with pytest.raises(FieldError) as refused:
        resolve(DTU, request_)
    assert refused.value.field == field
    assert says in refused.value.message


def test_several_tasks_of_a_program_that_is_not_ddp_are_refused():
    with pytest.raises(FieldError) as refused:
        resolve(DTU, ResourceRequest(job_name="j", ntasks_per_node=4), ddp=False)
    assert refused.value.field == "ntasks_per_node" and "no srun" in refused.value.message


def test_a_log_path_bsub_could_misread_is_refused():
    assert refusal(ResourceRequest(job_name="j", log='logs/it"s-%j.out')).field == "log"
    assert '#BSUB -o "logs/my runs/j-%J.out"' in header(
        ResourceRequest(job_name="j", log="logs/my runs/j-%j.out")
    )


def test_a_scheduler_without_steps_starts_ddp_with_torchrun_on_its_one_node():
    text = render_bsub(
        DTU,
        resolve(DTU, ResourceRequest(job_name="ddp", partition="gpua100", gpus=2)),
        JobInputs.defaults("t"),
    ).text
    assert "srun" not in text and "scontrol" not in text and "SLURM_JOB_ID" not in text
    assert "--nnodes=1 --nproc-per-node=2" in text.replace(" \\\n    ", " ")
    assert "rendezvous_host=127.0.0.1" in text
    assert bash_syntax(text).returncode == 0
    assert shellcheck(text).stdout == ""


# --- the task --------------------------------------------------------------------------------------


def test_invoke_sbatch_writes_the_bsub_script_for_an_lsf_profile(tmp_path: Path):
    target = tmp_path / "job.sh"
    done = invoke(
        "sbatch", "--cluster=dtu", "--partition", "gpuv100", "--gpus", "1", "--save", str(target), cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    assert target.read_text().startswith("#!/bin/bash\n#BSUB -J trainer\n#BSUB -q gpuv100\n")


def test_invoke_sbatch_refuses_a_queue_limit_in_one_line(tmp_path: Path):
    target = tmp_path / "job.sh"
    done = invoke(
        "sbatch",
        "--cluster=dtu",
        "--partition",
        "gpua100",
        "--time",
        "25:00:00",
        "--save",
        str(target),
        cwd=REPO,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "error: time: 1-01:00:00 exceeds the limit of queue 'gpua100' (allowed: up to 1-00:00:00)"
    ]
    assert not target.exists() and done.stdout == ""


@pytest.mark.parametrize("task", ["submit", "shell"])
def test_invoke_submit_refuses_an_lsf_cluster_in_one_line_before_doing_anything(task: str):
    done = invoke(task, "--cluster=dtu", "--gpus", "1", cwd=REPO)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "error: dtu uses LSF: hpcbox renders its bsub script (hpcbox sbatch --cluster=dtu) "
        "but cannot submit to it yet"
    ]
    assert done.stdout == ""


# --- running the script with LSF's variables ---------------------------------------------------------


@pytest.fixture
def lsf(tmp_path: Path) -> Sandbox:
    """The Slurm sandbox's files and stand-ins, with the environment LSF gives a job instead of Slurm's."""
    sandbox = make_sandbox(tmp_path)
    stub = sandbox.root / "bin" / "brequeue"
    stub.write_text(STUB_BREQUEUE)
    stub.chmod(0o755)
    env = {name: value for name, value in sandbox.env.items() if not name.startswith("SLURM_")}
    env.update(
        LSB_JOBID="4242",
        LSB_JOBINDEX="0",  # LSF sets it to 0 outside arrays
        LS_SUBCWD=str(sandbox.submit),
        LSB_HOSTS="n-62-20-1",
        LSB_MCPU_HOSTS="n-62-20-1 4",
        LSB_DJOB_NUMPROC="4",
        LSB_QUEUE="gpuv100",
        STUB_BREQUEUE_LOG=str(sandbox.root / "brequeue.log"),
    )
    return dataclasses.replace(sandbox, env=env)


def lsf_script(sandbox: Sandbox, request: ResourceRequest, args: tuple[str, ...] = ()) -> JobScript:
    profile = dataclasses.replace(DTU, node_scratch=str(sandbox.node_scratch))
    return render_bsub(profile, resolve(profile, request), JobInputs.defaults("trainer"), args)


def brequeue_calls(sandbox: Sandbox) -> list[str]:
    log = sandbox.root / "brequeue.log"
    return log.read_text().splitlines() if log.exists() else []


def requeue_count(sandbox: Sandbox) -> str | None:
    counter = sandbox.run_dir.with_name(sandbox.run_dir.name + ".requeued")
    return counter.read_text().strip() if counter.exists() else None


def test_success_copies_results_back_and_removes_scratch_under_lsf(lsf: Sandbox):
    status, output = lsf.run(lsf_script(lsf, ONE_GPU, ("--epochs", "1")))
    assert status == 0, output
    argv = lsf.recorded_argv
    assert argv[:2] == ["exec", "--nv"] and f"{lsf.submit}/code:/code:ro" in argv
    assert argv[argv.index("--output-dir") + 2 :] == ["--epochs", "1"]
    assert (lsf.run_dir / "metrics.jsonl").read_text() == '{"epoch": 1}\n'
    assert lsf.scratch_was == lsf.node_scratch / "researcher" / "hpcbox-4242"
    assert not lsf.scratch_was.exists()
    assert brequeue_calls(lsf) == [] and lsf.slurm_calls() == []
    assert "hpcbox: job 4242 on" in output


def test_the_submit_directory_comes_from_ls_subcwd(lsf: Sandbox, tmp_path: Path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = lsf_script(lsf, ResourceRequest(job_name="cwd"))
    script.write(lsf.submit / "job.sh")
    done = subprocess.run(
        ["bash", str(lsf.submit / "job.sh")], cwd=elsewhere, env=lsf.env, capture_output=True
    )
    assert done.returncode == 0, done.stderr
    assert (lsf.run_dir / "metrics.jsonl").exists() and list(elsewhere.iterdir()) == []


def test_failing_trainer_still_copies_back_and_cleans_up_under_lsf(lsf: Sandbox):
    status, output = lsf.run(lsf_script(lsf, ONE_GPU), mode="fail")
    assert status == 3, output
    assert (lsf.run_dir / "metrics.jsonl").exists()
    assert not lsf.scratch_was.exists()
    assert brequeue_calls(lsf) == []


def test_a_checkpointed_trainer_is_requeued_with_brequeue_and_counted(lsf: Sandbox):
    status, output = lsf.run(lsf_script(lsf, ONE_GPU), mode="checkpoint")
    assert status == 0, output
    assert brequeue_calls(lsf) == ["4242"]
    assert requeue_count(lsf) == "1"
    assert "(restart 1 of at most 10)" in output
    assert (lsf.run_dir / "checkpoints" / "last.pt").read_text() == "SIGUSR1"
    assert not lsf.scratch_was.exists()


@pytest.mark.parametrize(("requeued_so_far", "requeued"), [(1, True), (2, False)])
def test_an_lsf_job_requeues_itself_at_most_max_restarts_times(lsf: Sandbox, requeued_so_far, requeued):
    lsf.run_dir.parent.mkdir(parents=True, exist_ok=True)
    lsf.run_dir.with_name("4242.requeued").write_text(f"{requeued_so_far}\n")
    status, output = lsf.run(lsf_script(lsf, ResourceRequest(job_name="b", max_restarts=2)), "checkpoint")
    assert brequeue_calls(lsf) == (["4242"] if requeued else []), output
    if requeued:
        assert status == 0 and "(restart 2 of at most 2)" in output and requeue_count(lsf) == "2"
    else:
        assert status == 75, output
        assert "has been requeued 2 times (--max-restarts)" in output and "`brequeue 4242`" in output
    assert (lsf.run_dir / "checkpoints" / "last.pt").read_text() == "SIGUSR1"


def test_usr1_before_the_run_limit_is_forwarded_and_the_job_requeued(lsf: Sandbox):
    process = lsf.start(lsf_script(lsf, ResourceRequest(job_name="usr1", time="30")), mode="wait")
    _wait_for(lsf.root / "ready")
    process.send_signal(signal.SIGUSR1)  # what -wa USR1 -wt does to the job
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    assert (lsf.run_dir / "checkpoints" / "last.pt").read_text() == "SIGUSR1"
    assert brequeue_calls(lsf) == ["4242"]
    assert not lsf.scratch_was.exists()


def test_bkills_term_checkpoints_cleans_up_and_does_not_requeue(lsf: Sandbox):
    process = lsf.start(lsf_script(lsf, ResourceRequest(job_name="term")), mode="wait")
    _wait_for(lsf.root / "ready")
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 75, output
    assert (lsf.run_dir / "checkpoints" / "last.pt").read_text() == "SIGTERM"
    assert b"stopped by SIGTERM" in output
    assert brequeue_calls(lsf) == [] and requeue_count(lsf) is None
    assert not lsf.scratch_was.exists()


def test_an_array_task_has_its_own_scratch_and_results_and_requeues_alone(lsf: Sandbox):
    lsf.env.update(LSB_JOBINDEX="3")
    status, output = lsf.run(lsf_script(lsf, ResourceRequest(job_name="sweep", array="1-4")), "checkpoint")
    assert status == 0, output
    task_dir = lsf.submit / "runs" / "4242_3"
    assert (task_dir / "checkpoints" / "last.pt").exists()
    assert lsf.scratch_was.name == "hpcbox-4242_3" and not lsf.scratch_was.exists()
    assert brequeue_calls(lsf) == ["4242[3]"]
    assert (lsf.submit / "runs" / "4242_3.requeued").read_text() == "1\n"
