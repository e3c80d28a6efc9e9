#!/bin/sh
# `apptainer` on a compute node that has `singularity` alone (`cluster.up --runtime singularity`): the
# binary is Apptainer's, named singularity, and it runs itself by this name to unpack an image, so the
# name answers it; to a user or a job, there is no apptainer here.
if [ "$(readlink "/proc/$PPID/exe" 2>/dev/null)" = /usr/bin/singularity ]; then
    exec /usr/bin/singularity "$@"
fi
echo "apptainer: command not found (this node has singularity)" >&2
exit 127
