"""`hpcbox shell`: an allocation on a compute node with a job's SIF and code."""

from __future__ import annotations

from collections.abc import Callable

from hpcbox.ledger import JobRecord
from hpcbox.render.profiles import ClusterProfile
from hpcbox.render.resources import Resources
from hpcbox.tools import ssh


def shell(
    connection: ssh.Connection,
    profile: ClusterProfile,
    resources: Resources,
    record: JobRecord,
    command: str | None,
    on_line: Callable[[str], None],
) -> None:
    """An allocation on a compute node with the SIF and code of ``record`` (the last job there):
    `apptainer shell` on the user's terminal, or ``command`` with its output to ``on_line``."""
    from hpcbox.render.sbatch import render_shell

    code_dir = f"{record.submit_dir}/code/{record.code_snapshot[:16]}"
    remote = render_shell(profile, resources, record.sif, code_dir, command)
    if command is None:
        connection.interactive(remote)
        return
    connection.stream(remote, what=f"run a command on a compute node of {record.cluster}", on_line=on_line)
