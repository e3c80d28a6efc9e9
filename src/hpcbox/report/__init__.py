"""Was a job efficient: Slurm's accounting, the trainer's metrics and the GPU samples into verdicts per
figure, with advice, and a plot (`hpcbox report`)."""
