"""Slurm's user commands, run on a cluster's login node over SSH."""

from __future__ import annotations

import tempfile

from hpcbox.tools import proc, ssh


def test_only(target: ssh.Target, script_text: str) -> str:
    """Ask the cluster whether it would accept `script_text` (`sbatch --test-only`); its answer, or raise."""
    with tempfile.TemporaryFile() as script:
        script.write(script_text.encode())
        script.seek(0)
        done = proc.run(
            ssh.ssh_argv(target, ["sbatch", "--test-only"]),
            what=f"check the job script with `sbatch --test-only` on {target.address}",
            hint="the message above is Slurm's; fix the resource it names",
            stdin=script,
        )
    return (done.stderr or done.stdout).strip()
