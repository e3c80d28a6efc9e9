#!/bin/bash
# Slurm Epilog: the site removes the job's scratch folder once the job has ended on this node.
set -eu
# shellcheck source=/dev/null
. /etc/hpcbox-site.env
rm -rf -- "${HPCBOX_SCRATCH_DIR:?}/$SLURM_JOB_USER.$SLURM_JOB_ID.0"
