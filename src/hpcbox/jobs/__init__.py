"""A job's life: submit (what the cluster lacks shipped first, by hpcbox.store), status, logs, fetch
and the efficiency report, cancel, and a shell beside it; its record is hpcbox.ledger's. The public API
(hpcbox.api) uses the names below; each module holds one part of the job's life.

Each name is imported from its module at first use: `status` needs the ledger and squeue, not the
build, the SIF conversion and the Docker SDK that `submit` stands on."""

from __future__ import annotations

import importlib
import sys
import types

# name → the module that defines it: one of hpcbox.jobs, or a package's own (the ledger's)
_DEFINED_IN = {
    "CANCEL_GRACE_S": "follow",
    "JobRecord": "hpcbox.ledger",
    "Ledger": "hpcbox.ledger",
    "Place": "connect",
    "array_state": "follow",
    "cancel": "follow",
    "check_reachable": "identity",
    "connection_target": "connect",
    "data_path": "submit",
    "describe": "follow",
    "describe_tasks": "follow",
    "exits_kept": "follow",
    "failed_tasks": "follow",
    "FOLLOW_EVERY_S": "fetch",
    "fetch": "fetch",
    "fetch_changed": "fetch",
    "fetch_following": "fetch",
    "fetched": "fetch",
    "fetched_logs": "fetch",
    "fetched_outcomes": "follow",
    "follow_command": "follow",
    "gone": "identity",
    "local_run_dir": "fetch",
    "log_paths": "submit",
    "log_text": "follow",
    "logs": "follow",
    "look": "follow",
    "on_mini_cluster": "connect",
    "overview": "follow",
    "place_of": "connect",
    "prepare_payload": "submit",
    "refuse_unfetched": "identity",
    "rehearse": "connect",
    "report": "fetch",
    "require_slurm": "connect",
    "running_mini_cluster": "connect",
    "say_rehearsal_slurm": "connect",
    "script_started": "follow",
    "shell": "shell",
    "state": "follow",
    "submit": "submit",
    "sweep_of": "follow",
    "sweep_outcomes": "follow",
    "task_states": "follow",
    "wait": "follow",
}
__all__ = sorted(_DEFINED_IN)


class _NamesFromTheirModules(types.ModuleType):
    """hpcbox.jobs, whose names above each come from their module, imported at first use. Resolved on
    every access, not once: `fetch`, `shell` and `submit` are each a module and that module's function,
    and importing the module sets the package's attribute to the module."""

    def __getattribute__(self, name: str) -> object:
        module = _DEFINED_IN.get(name)
        if module is None:
            return super().__getattribute__(name)
        return getattr(importlib.import_module(module if "." in module else f"{__name__}.{module}"), name)

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *_DEFINED_IN})


sys.modules[__name__].__class__ = _NamesFromTheirModules
