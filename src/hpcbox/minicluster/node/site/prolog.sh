#!/bin/bash
# Slurm Prolog on a rehearsal cluster whose site sets node scratch per job (the Alliance's and Mila's
# $SLURM_TMPDIR): the job's own folder under the node's scratch, owned by the job's user, in the
# site's layout <scratch>/<user>.<job id>.0.
set -eu
# shellcheck source=/dev/null
. /etc/hpcbox-site.env
install -d -o "$SLURM_JOB_USER" -m 0700 "$HPCBOX_SCRATCH_DIR/$SLURM_JOB_USER.$SLURM_JOB_ID.0"
