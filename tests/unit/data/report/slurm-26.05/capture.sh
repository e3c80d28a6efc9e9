#!/bin/bash
# How the files beside it were captured: run on the login node of a Slurm 26.05 mini cluster
# (`hpcbox cluster.up --slurm 26.05`, 2 nodes of 2 CPUs and 2000 MB, gres gpu:2, cgroups), with burn.py
# in the home folder. The jobs of ../README.md, plus the squeue/sacct lines `hpcbox status` reads, as
# ../slurm-22.05/capture.sh; sacct's fields are report.SACCT_FIELDS, Restarts included. At the end,
# what 26.05 adds: the job's SLUID (scontrol, sacct, a task's environment) and a task's cgroups.
set -u
F=JobID,JobName,Partition,State,ExitCode,Restarts,Elapsed,ElapsedRaw,Timelimit,TimelimitRaw,NNodes,NCPUS,NTasks,TotalCPU,CPUTimeRAW,ReqMem,MaxRSS,AllocTRES,ReqTRES,NodeList,Submit,Start,End
SQ='%i|%T|%r|%M|%l|%N'
STATE=JobID,State,Reason,Elapsed,Timelimit,ExitCode,NodeList
out=$HOME/capture; rm -rf "$out"; mkdir -p "$out"; cd "$out" || exit 1
cp ~/burn.py .
sub() { sbatch --parsable "$@" | cut -d';' -f1; }
acct() { sacct -j "$1" --noheader --parsable2 --format=$F; }
wait_end() { while squeue --noheader --jobs="$1" 2>/dev/null | grep -q .; do sleep 1; done; sleep 3; }
wait_state() { while [ "$(squeue --noheader --jobs="$1" --format=%T)" != "$2" ]; do sleep 1; done; }

steps=$(sub -J rpt-steps --mem=1G --cpus-per-task=2 --time=5 --wrap 'python3 burn.py 100 8; srun python3 burn.py 300 20')
gpu=$(sub -J rpt-percpu --mem-per-cpu=500M --cpus-per-task=2 --gres=gpu:1 -p gpu --time=10 --wrap 'python3 burn.py 200 15 & python3 burn.py 200 15; wait')
# The cluster's 4 CPUs are taken: this one waits.
cancelled=$(sub -J rpt-cancel --mem=1G --time=5 --wrap 'python3 burn.py 50 300')
sleep 6
acct "$cancelled" > pending.sacct
squeue --noheader --states=all --jobs="$cancelled" --format="$SQ" > pending.squeue
sacct -X --noheader --parsable2 --jobs="$cancelled" --format=$STATE > pending.state
wait_state "$gpu" RUNNING; sleep 8
acct "$gpu" > running-gpu.sacct
squeue --noheader --states=all --jobs="$gpu" --format="$SQ" > running.squeue
wait_end "$gpu"; acct "$gpu" > gpu-percpu.sacct
squeue --noheader --states=all --jobs="$gpu" --format="$SQ" > completed.squeue
sacct -X --noheader --parsable2 --jobs="$gpu" --format=$STATE > completed.state

failed=$(sub -J rpt-failed --mem=1G --time=5 --wrap 'python3 burn.py 50 8; exit 3')
short=$(sub -J rpt-short --wrap true)
oom=$(sub -J rpt-oom --mem=300M --time=5 --wrap 'python3 burn.py 500 10')
wait_end "$steps"; acct "$steps" > steps.sacct
wait_state "$cancelled" RUNNING; sleep 30; scancel "$cancelled"
wait_end "$failed"; acct "$failed" > failed.sacct
sacct -X --noheader --parsable2 --jobs="$failed" --format=$STATE > failed.state
wait_end "$short"; acct "$short" > short.sacct
wait_end "$oom"; acct "$oom" > oom.sacct
wait_end "$cancelled"; acct "$cancelled" > cancelled.sacct
sacct -X --noheader --parsable2 --jobs="$cancelled" --format=$STATE > cancelled.state

nolimit=$(sub -J rpt-nolimit -p gpu --gpus=2 --mem=0 --wrap 'python3 burn.py 150 12')
requeued=$(sub -J rpt-requeue --requeue --mem=1G --time=5 --wrap 'python3 burn.py 100 30')
timeout=$(sub -J rpt-timeout --mem=500M --time=1 --wrap 'python3 burn.py 20 200')
# shellcheck disable=SC2016  # the task's own shell expands it
array=$(sub -J rpt-array --array=1-3 --mem=200M --time=5 --cpus-per-task=2 --wrap 'python3 burn.py 10 10; [ "$SLURM_ARRAY_TASK_ID" != 2 ]')
wait_state "$requeued" RUNNING; sleep 8; scontrol requeue "$requeued"
sleep 2
squeue --noheader --array --states=all --jobs="$array" --format="$SQ" > array-running.squeue
sacct -X --noheader --parsable2 --jobs="$array" --format=$STATE > array-running.state
squeue --noheader --all --states=all --format='%i %T %j' > unfinished.squeue
wait_end "$nolimit"; acct "$nolimit" > gpus-nolimit.sacct
wait_end "$array"
sacct -X --noheader --parsable2 --jobs="$array" --format=$STATE > array-done.state
sacct -X --noheader --parsable2 --jobs="$array,$failed" --format=JobID,End > end.sacct
wait_end "$requeued"; acct "$requeued" > requeued.sacct
sacct -X --duplicates --noheader --parsable2 --jobs="$requeued" --format=JobID,State > requeued.duplicates
wait_end "$timeout"; acct "$timeout" > timeout.sacct
sacct -X --noheader --parsable2 --jobs="$timeout" --format=$STATE > timeout.state
# 26.05's new job identifier, the SLUID: in a task's environment and scontrol's record of the job (-d
# shows it), beside the cgroup paths slurmd made for the task (cgroup/v1 here: still job_<id>), and
# sacct's (a requeued job's runs each have their own).
# shellcheck disable=SC2016  # the job's own shell expands it
sluid=$(sub -J rpt-sluid --mem=200M --time=5 --wrap 'env | grep -E "^SLURM_JOB_(ID|SLUID)=" | sort; grep -E ":(memory|cpuset|devices|freezer):" /proc/self/cgroup; scontrol show job -d "$SLURM_JOB_ID" | grep -E "^JobId=|SLUID="')
wait_end "$sluid"; cp "slurm-$sluid.out" sluid.job
sacct -X --duplicates --noheader --parsable2 --jobs="$requeued,$sluid" --format=JobID,State,SLUID,OriginalSLUID > sluid.sacct
sinfo --version > version
echo captured
