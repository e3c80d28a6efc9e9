"""hpcbox: take a PyTorch training project from a laptop to a Slurm cluster, in containers."""

__version__ = "0.1.0"
