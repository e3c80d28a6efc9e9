"""Job scripts, pure: a cluster profile, the job's resources and options in, a Slurm or LSF script out."""
