#!/bin/sh
# `module` on a rehearsal cluster: the site loads Apptainer with environment modules; here it is on
# PATH already, so nothing is loaded. Said on stderr, so the job's log shows what was asked.
echo "module (hpcbox rehearsal stub): '$*' loads nothing; apptainer is on PATH" >&2
