"""hpcbox's Hydra launcher: `hydra/launcher=hpcbox` runs a multirun as one array job on a Slurm site."""
