#!/bin/bash
# Slurm TaskProlog (runs as the job's user before each task, the batch script included): what it
# prints as `export NAME=value` lands in the task's environment, as the site's $SLURM_TMPDIR does.
set -eu
# shellcheck source=/dev/null
. /etc/hpcbox-site.env
echo "export $HPCBOX_SCRATCH_VARIABLE=$HPCBOX_SCRATCH_DIR/$(id -un).$SLURM_JOB_ID.0"
