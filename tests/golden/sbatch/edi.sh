#!/bin/bash
#SBATCH --job-name=digits
#SBATCH --partition=PGR-Standard
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=4
#SBATCH --mem=32G
#SBATCH --time=1-00:00:00
#SBATCH --output=logs/digits-%j.out
#SBATCH --signal=B:USR1@300
#SBATCH --gres=gpu:2
#SBATCH --requeue
#SBATCH --open-mode=append

# Rendered by hpcbox for cluster edi: re-render it, rather than edit it.
# Submit it from the directory the relative paths below start at, once the log folder exists:
#   mkdir -p logs && sbatch <this file>
# sif: images/trainer.sif
# sif sha256: 0000000000000000000000000000000000000000000000000000000000000000
# code revision: 0123456789abcdef0123456789abcdef01234567
# assumed for edi, not published by the site (check them there): apptainer.command = "apptainer"

set -euo pipefail

submit_dir=${SLURM_SUBMIT_DIR:-$PWD}
sif="$submit_dir"/images/trainer.sif
code_dir="$submit_dir"/code
dataset="$submit_dir"/data/trainer.tar
job_key="${SLURM_JOB_ID}"
run_dir="$submit_dir"/runs/"$job_key"
tracking_id=hpcbox-"${job_key//\//-}"
job_scratch=/disk/scratch/"${USER:-$(id -un)}"/hpcbox-"${SLURM_JOB_ID}"
trainer_pid=""
sampler_pid=""
syncer_pid=""
terminated=""
cleaned=""
janitor_pid=""
time_up=""
preemption=""

# Runs a command once on every node of the job (node scratch is per node).
on_each_node() {
    "$@"
}
make_run_dir() {
    mkdir -p "$run_dir"
}

# Run on each node: sends signal $1 to the processes of job $2 whose command line matches $3. A
# pattern alone would also reach this shell (a program run by bash matches it) and the processes of
# the user's other jobs; the job's processes carry HPCBOX_JOB in their environment.
# shellcheck disable=SC2016  # expanded by the shell on each node
signal_job='for pid in $(pgrep --uid "$(id -u)" --full "$3"); do
    if grep -qzxF "HPCBOX_JOB=$2" "/proc/$pid/environ" 2>/dev/null; then
        kill -s "$1" "$pid" 2>/dev/null || true
    fi
done'

# Renames each file of folder $1 (beside the run folder) into the same place in the run folder, then
# removes $1.
move_into_run_dir() {
    (cd "$1" && find . -mindepth 1 -type d -exec mkdir -p "$run_dir/{}" ';' &&
        find . ! -type d -exec mv -f '{}' "$run_dir/{}" ';') && rm -rf -- "$1"
}
# Copies the results to shared storage through a folder beside them, renaming each file into place
# whole: a script killed mid-copy (Slurm's KillWait after scancel) leaves the earlier copy of a file or
# the new one, never half of it. A file the program renames or removes while it is copied (a
# checkpoint's temporary file, as a cancelled program stops) fails that copy; another, a moment
# later, finds the folder settled.
copy_back() {
    local incoming="$run_dir.incoming" attempt
    make_run_dir
    for attempt in 1 2 3; do
        rm -rf -- "$incoming"
        mkdir -p "$incoming"
        if cp -a "$job_scratch/out/." "$incoming/"; then
            # The status said explicitly: a bare `return` in the EXIT trap's call returns the status
            # the script was exiting with, and a program that failed made every copy "failed".
            move_into_run_dir "$incoming" && return 0
            return 1
        fi
        if (( attempt < 3 )); then
            echo "hpcbox: the results changed while being copied; copying them again" >&2
            sleep "$attempt"
        fi
    done
    rm -rf -- "$incoming"
    return 1
}

# Copies results and checkpoints to shared storage, then removes the job's node scratch.
# Runs on every way out: success, failure, scancel and the time limit.
clean_up() {
    if [[ -n $cleaned ]]; then
        return 0
    fi
    if [[ -n $sampler_pid ]]; then
        kill "$sampler_pid" 2>/dev/null || true
        sampler_pid=""
    fi
    if [[ -n $syncer_pid ]]; then
        # It finishes the copy it is making, if any, before this one starts. Polled: bash's `wait` for it
        # can block on the janitor step instead once Slurm has signalled the whole job, until KillWait.
        # TERM goes again each second: one sent as the syncer started, before its own trap was set, is
        # lost (bash resets the traps a subshell inherits), and it would sleep out its interval. The
        # first looks come 0.01 s apart: a syncer between copies ends at once, and every job's end waits.
        kill "$syncer_pid" 2>/dev/null || true
        local looks=0
        while kill -0 "$syncer_pid" 2>/dev/null; do
            if (( ++looks <= 10 )); then
                sleep 0.01
            else
                sleep 0.2
                if (( looks % 5 == 0 )); then
                    kill "$syncer_pid" 2>/dev/null || true
                fi
            fi
        done
        syncer_pid=""
    fi
    if [[ -d $job_scratch/out ]]; then
        copy_back || echo "hpcbox: copying results to $run_dir failed" >&2
    fi
    # This node's own first, then the janitor's tasks remove the other nodes': after scancel or the
    # time limit Slurm starts no new step, so the loop below is left for a janitor that did not start.
    rm -rf -- "$job_scratch" || true
    if [[ -n $janitor_pid ]]; then
        # USR2 reaches the janitor's tasks once they run; a step still starting is ended outright.
        kill -s USR2 "$janitor_pid" 2>/dev/null || true
        local look
        for look in {1..59}; do  # 5 s at most: 0.01 s apart at first, as it usually ends at once
            kill -0 "$janitor_pid" 2>/dev/null || break
            if (( look <= 10 )); then
                sleep 0.01
            else
                sleep 0.1
            fi
        done
        # Then TERM, and KILL if it still runs 5 s on: an unbounded `wait` here would hold the job.
        kill "$janitor_pid" 2>/dev/null || true
        for look in {1..50}; do
            kill -0 "$janitor_pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -s KILL "$janitor_pid" 2>/dev/null || true
        if wait "$janitor_pid"; then
            janitor_pid=""
            cleaned=1
            return 0
        fi
        janitor_pid=""
    fi
    local attempt
    for attempt in 1 2 3; do
        if on_each_node rm -rf -- "$job_scratch"; then
            cleaned=1
            return 0
        fi
        # Slurm can refuse a new step on nodes whose previous step is still being torn down.
        sleep $((attempt * 5))
    done
    echo "hpcbox: could not remove $job_scratch" >&2
}

# shellcheck disable=SC2317  # run by `trap`, which shellcheck does not follow
on_exit() {
    local status=$?
    trap - EXIT
    clean_up
    exit "$status"
}

# A preemption's TERM, told from a cancel's: by then Slurm has decided to requeue the job, and the job's
# Restarts is one more than this run's count (unset on the first run). No variable of the job tells it.
# shellcheck disable=SC2317  # run by `trap`, which shellcheck does not follow
preempted() {
    local shown
    shown=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null) || return 1
    [[ $shown =~ Restarts=([0-9]+) ]] && (( BASH_REMATCH[1] > ${SLURM_RESTART_COUNT:-0} ))
}
# Where the site sends the job's own signal as it is picked (PreemptParameters=send_user_signal), the
# USR1 is a preemption's, told from the time limit's by the pick's time: Slurm sets the job's PreemptTime
# then (it shows None before). The script then leaves the requeue to Slurm, as after a preemption's TERM.
# shellcheck disable=SC2317  # run by `trap`, which shellcheck does not follow
picked() {
    local shown
    shown=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null) || return 1
    [[ $shown =~ PreemptTime=([^[:space:]]+) && ${BASH_REMATCH[1]} != None ]]
}

# Slurm signals this shell: USR1 before the time limit, TERM on scancel, or TERM to this shell alone
# (`scancel --batch --signal=TERM`, as `hpcbox cancel` does), TERM at a preemption's grace time's
# end (USR1 as it is picked where the site sets send_user_signal). The trainer checkpoints on both.
# shellcheck disable=SC2317  # run by `trap`, which shellcheck does not follow
forward() {
    local signal=$1  # to the trainer
    if [[ $1 == USR1 ]]; then
        time_up=1
        if picked; then
            preemption=1
        fi
    elif [[ $1 == TERM ]] && preempted; then
        # Preempted: the trainer is given the time limit's signal, on which it checkpoints (a program
        # may take TERM as a cancel), and Slurm requeues the job itself.
        time_up=1
        preemption=1
        signal=USR1
    else
        terminated=$1
    fi
    if [[ -n $trainer_pid ]]; then
        # To each node's torchrun, which tells its ranks: srun would signal every process of
        # the step, and the squashfuse serving the SIF (unprivileged Apptainer) dies of it.
        # After a plain scancel no step can start, but Slurm has signalled every process.
        if [[ $signal == USR1 || $signal == TERM ]]; then
            on_each_node bash -c "$signal_job" signal "$signal" "${SLURM_JOB_ID}" \
                '^([^ ]*/)?python[0-9.]* -m hpctrain[.]torchrun ' || true
        fi
    fi
}

trap on_exit EXIT
trap 'forward USR1' USR1
trap 'forward TERM' TERM
trap 'forward INT' INT

if ! apptainer --version >/dev/null 2>&1; then
    echo "hpcbox: \`apptainer\` does not run on $(hostname);" \
        "name the container runtime this site has in its profile ([apptainer] command)," \
        "or with --container" >&2
    exit 69
fi
for input in "$sif" "$dataset"; do
    if [[ ! -f $input ]]; then
        echo "hpcbox: $input does not exist on $(hostname); ship the job's inputs first" >&2
        exit 66
    fi
done
if [[ ! -d $code_dir ]]; then
    echo "hpcbox: code snapshot $code_dir does not exist; ship the job's inputs first" >&2
    exit 66
fi

echo "hpcbox: job ${SLURM_JOB_ID} on $(hostname): node scratch $job_scratch, results $run_dir" >&2
# A job that finished is not run again when it is started again: a preemption that picks a job in its
# last seconds requeues it whatever it did in its grace time, and a requeue by hand takes a finished job
# too. Its results stay as they are.
if [[ $(cat -- "$run_dir/.hpcbox-exit" 2>/dev/null) == 0 ]]; then
    echo "hpcbox: job ${SLURM_JOB_ID} finished in an earlier run (exit status 0): it is not run again," \
        "and its results in $run_dir stay as they are" >&2
    exit 0
fi
# Scratch goes however the job ends, even where no new step can start or this script
# itself is killed (Slurm enforcing --mem without cgroups kills the whole batch step).
# shellcheck disable=SC2016  # expanded by the shell on each node
janitor='batch_node=$1
batch_pid=$2
scratch=$3
exec {unwritten}<> <(:)
on_signal() {
    if [[ $SLURMD_NODENAME == "$batch_node" ]]; then
        while [[ -d $scratch ]] && kill -0 "$batch_pid" 2>/dev/null; do
            read -r -t 1 -u "$unwritten" || true
        done
    fi
    rm -rf -- "$scratch"
    exit 0
}
trap on_signal TERM USR2
while :; do
    read -r -t 1 -u "$unwritten" || true
done'
srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --overlap --mem=0 --job-name=hpcbox-janitor bash -c "$janitor" janitor "$SLURMD_NODENAME" "$$" \
    "$job_scratch" </dev/null &
janitor_pid=$!
on_each_node mkdir -p "$job_scratch/data" "$job_scratch/out" "$job_scratch/tmp" "$job_scratch/sif"
# One archive in, extracted on node-local disk: shared file systems are slow at many small files.
on_each_node tar -xf "$dataset" -C "$job_scratch/data"

# Whether the compute nodes can mount a SIF (FUSE for an unprivileged Apptainer) is not known for this
# site: each node tries, and where one cannot, every node unpacks it to a folder on its scratch and
# runs that. The profile's [apptainer] fuse = true or false says it instead.
unpack=""
if ! tried=$(on_each_node apptainer exec "$sif" true 2>&1); then
    unpack=1
    echo "hpcbox: a node cannot run the SIF as it is:" \
        "$(grep -m1 -e FATAL -e ERROR <<<"$tried" || echo "${tried##*$'\n'}")" >&2
elif grep -q "Converting SIF file to temporary sandbox" <<<"$tried"; then
    # Apptainer without squashfuse: it extracts the whole SIF again for every process it starts.
    unpack=1
    echo "hpcbox: a node cannot mount the SIF (Apptainer extracts it for each process)" >&2
fi
if [[ -n $unpack ]]; then
    unpacking=$SECONDS
    if ! on_each_node apptainer build --tmpdir "$job_scratch/tmp" --sandbox "$job_scratch/sif/unpacked" \
        "$sif" >"$job_scratch/unpack.log" 2>&1; then
        cat "$job_scratch/unpack.log" >&2
        echo "hpcbox: unpacking the SIF to node scratch failed" >&2
        exit 1
    fi
    sif="$job_scratch/sif/unpacked"
    echo "hpcbox: each node runs the SIF unpacked on its scratch, $sif ($((SECONDS - unpacking)) s)" >&2
fi
# A requeued job carries on from the checkpoints its previous run copied back (every rank reads them).
if [[ -d $run_dir ]]; then
    on_each_node cp -a "$run_dir/." "$job_scratch/out/"
fi

if command -v nvidia-smi >/dev/null 2>&1; then
    make_run_dir
    nvidia-smi --query-gpu=timestamp,index,utilization.gpu,utilization.memory,memory.used,memory.total \
        --format=csv -l 30 >"$run_dir/gpu-utilization.csv" 2>&1 &
    sampler_pid=$!
fi

# Checkpoints and results reach shared storage every 600 s while the job runs, not only
# when it ends: a node that dies takes its scratch and this shell's exit trap with it, and the requeued
# job resumes from the last copy. Between those copies, every 10 s, the small files that changed
# (under 16384 KiB each: logs, metrics, curves) go too, so that `hpcbox watch` shows the run as it
# goes at the cost of those files alone. A copy under way when the job ends is finished first
# (clean_up).
copy_recent() {
    local incoming="$run_dir.recent" stamp="$job_scratch/.copied"
    make_run_dir
    rm -rf -- "$incoming"
    mkdir -p "$incoming"
    touch "$stamp.next"
    local newer=()
    [[ -e $stamp ]] && newer=(-newer "$stamp")
    (cd "$job_scratch/out" &&
        find . -type f -size -16384k "${newer[@]}" -exec cp -p --parents -t "$incoming" -- '{}' +) &&
        move_into_run_dir "$incoming" && mv -f -- "$stamp.next" "$stamp"
}
(
    stop=""
    sleeper=""
    since_s=0
    trap 'stop=1; [[ -z $sleeper ]] || kill "$sleeper" 2>/dev/null' TERM
    trap '' USR1
    while [[ -z $stop ]]; do
        sleep 10 &
        sleeper=$!
        wait "$sleeper" || true
        sleeper=""
        [[ -z $stop ]] || break
        since_s=$((since_s + 10))
        if (( since_s >= 600 )); then
            since_s=0
            copy_back || echo "hpcbox: copying results to $run_dir failed; again in 600 s" >&2
        else
            copy_recent || echo "hpcbox: copying the newest small files to $run_dir failed" >&2
        fi
    done
) &
syncer_pid=$!

# The trainer runs in the background so that this shell can take Slurm's signals and pass them on.
# Once the time limit is near (USR1 came while the job was staging) it does not start: there is nothing
# to checkpoint yet, and the requeued job runs it whole.
if [[ -n $time_up ]]; then
    echo "hpcbox: the time limit is near; the trainer runs when the job is requeued" >&2
    status=75
else
# Several processes: on each node one srun task runs hpctrain.torchrun, which starts that node's trainer
# processes, passes USR1 and TERM on to them, and exits 75 when they checkpointed.
# Static rendezvous: a fixed set of nodes, the store on the job's first node (this one). A node's rank is
# its index in the job, so global rank 0, which writes checkpoints and metrics, runs on this node, whose
# scratch is copied back.
job_nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
rendezvous_host=${job_nodes%%$'\n'*}
rendezvous_port=$((20000 + SLURM_JOB_ID % 20000))
# shellcheck disable=SC2016  # the per-node shell's and the trainer's arguments are meant literally
srun --nodes=1 --ntasks=1 --ntasks-per-node=1 --cpus-per-task=8 --mem=0 --kill-on-bad-exit=0 \
    --wait=165 bash -c 'exec "$1" exec --env "PET_NODE_RANK=$SLURM_NODEID" "${@:2}"' per-node apptainer \
    --nv --bind "$job_scratch:/scratch" --bind "$code_dir:/code:ro" --env PYTHONPATH=/code \
    --env "OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}" --env SLURM_CPUS_PER_TASK=4 \
    --env "HPCBOX_JOB=${SLURM_JOB_ID}" --env HPCTRAIN_STOP_WITHIN_S=150 \
    --env "WANDB_RUN_ID=${WANDB_RUN_ID:-$tracking_id}" --env "WANDB_RESUME=${WANDB_RESUME:-allow}" \
    --env "WANDB_DIR=${WANDB_DIR:-/scratch/out}" \
    --env "MLFLOW_TRACKING_URI=${MLFLOW_TRACKING_URI:-file:///scratch/out/mlruns}" \
    --env "MLFLOW_ALLOW_FILE_STORE=${MLFLOW_ALLOW_FILE_STORE:-true}" \
    --env "WANDB_MODE=${WANDB_MODE:-offline}" --env "HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}" --pwd /scratch \
    "$sif" python -m hpctrain.torchrun --nnodes=1 --nproc-per-node=2 --rdzv-backend=static \
    --master-addr="$rendezvous_host" --master-port="$rendezvous_port" -m hpctrain train \
    --data-dir /scratch/data --output-dir /scratch/out --epochs 3 --model cnn --note \
    'it'"'"'s $HOME and `date`' &
    trainer_pid=$!
    # A USR1 as it started found no process to pass it to.
    if [[ -n $time_up ]]; then
        forward USR1
    fi
    status=0
    wait "$trainer_pid" || status=$?
    # `wait` also returns (128 + the signal) when a trap ran; wait again until the trainer itself has exited.
    while kill -0 "$trainer_pid" 2>/dev/null; do
        status=0
        wait "$trainer_pid" || status=$?
    done
    # A trap may have cut the last wait short just as the trainer exited: its own status (75 after a
    # checkpoint) is still to be had, as bash keeps an exited child's status for `wait`.
    if (( status > 128 )); then
        status=0
        wait "$trainer_pid" || status=$?
    fi
    trainer_pid=""
fi

# After the time limit's signal, a node whose launcher could not stop in time (itself stuck, not only
# its ranks) is killed once its peers have stopped: the run is cut short at the time limit, not
# failed, and the requeued job resumes from the last checkpoint written whole.
if [[ -n $time_up && -z $terminated ]] && (( status == 128 + 9 || status == 128 + 15 )); then
    echo "hpcbox: the trainer was killed (status $status) after the time limit's or preemption's signal;" \
        "it resumes from its last whole checkpoint" >&2
    status=75
fi
# Where the site sends no user signal, a job whose program runs as `srun` steps hears of its pick there
# alone: Slurm sends each step TERM, on which the trainer checkpoints and exits 75, and this shell hears
# nothing until the grace time's end. A program that ended so in a job that was picked was preempted.
if [[ -z $time_up && -z $terminated ]] && (( status == 75 )) && picked; then
    preemption=1
fi
# Preempted: Slurm requeues the job whatever this script does (a scancel now would cancel the requeue),
# and its next run resumes from the checkpoint copied back. A trainer that had finished keeps its
# outcome, so that the next run ends at once.
if [[ -n $preemption ]] && (( status == 75 )); then
    echo "hpcbox: job ${SLURM_JOB_ID} was preempted; the trainer checkpointed, and Slurm requeues the job," \
        "whose next run resumes from the checkpoint" >&2
    clean_up
    exit 0
fi
if [[ $status -eq 75 && -z $terminated ]]; then
    restarts=${SLURM_RESTART_COUNT:-0}
    if (( restarts < 10 )); then
        echo "hpcbox: the trainer checkpointed before the time limit; requeueing job ${SLURM_JOB_ID}" \
            "(restart $((restarts + 1)) of at most 10)" >&2
        clean_up
        scontrol requeue "$SLURM_JOB_ID"
        exit 0
    fi
    echo "hpcbox: the trainer checkpointed before the time limit, but job ${SLURM_JOB_ID} has been" \
        "requeued 10 times (--max-restarts); its checkpoints are in $run_dir:" \
        "\`scontrol requeue ${SLURM_JOB_ID}\` carries on from them" >&2
fi
echo "hpcbox: the trainer exited with status $status" >&2
# Its outcome, kept with its results: what tells a sweep's completed points from the others once Slurm
# has forgotten the job, or its cluster is gone (`hpcbox status`, `submit --resubmit-failed`).
echo "$status" >"$job_scratch/out/.hpcbox-exit" || true
if [[ -n $terminated ]]; then
    # Stopped on request: once the results are safe on shared storage, end the job as cancelled.
    clean_up
    echo "hpcbox: stopped by SIG$terminated; results are in $run_dir" >&2
    scancel "$SLURM_JOB_ID" || true
fi
exit "$status"
