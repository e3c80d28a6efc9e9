#!/bin/bash
# Slurm TaskProlog (runs as the job's user before each task, the batch script included): what it
# prints as `export NAME=value` lands in the task's environment, as the site's $SLURM_TMPDIR does.
set -eu
# shellcheck source=/dev/null
. /etc/hpcbox-site.env
# The node's GPUs are device files with no GPU behind them: a CUDA build of PyTorch (which would use
# a site's) trains on the CPU here instead of stopping (hpctrain.distributed reads this).
echo "export HPCBOX_PLACEHOLDER_GPUS=1"
if [ -n "$HPCBOX_SCRATCH_VARIABLE" ]; then
    echo "export $HPCBOX_SCRATCH_VARIABLE=$HPCBOX_SCRATCH_DIR/$(id -un).$SLURM_JOB_ID.0"
fi
