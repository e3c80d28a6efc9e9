"""hpcbox: take a PyTorch training project from a laptop to a Slurm cluster, in containers.

As a library (`hpcbox.api`): ``hpcbox.Site("edi").submit(["--epochs", "3"], gpus=1).wait()``. The names
below are imported at first use, so `import hpcbox` costs nothing a command does not use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# name → the module that defines it
_PUBLIC = {
    "Site": "hpcbox.api",
    "Project": "hpcbox.api",
    "Job": "hpcbox.api",
    "race": "hpcbox.api",
    "Entrant": "hpcbox.api",
    "HpcboxError": "hpcbox.errors",
    "FieldError": "hpcbox.errors",
}
__all__ = ["Entrant", "FieldError", "HpcboxError", "Job", "Project", "Site", "__version__", "race"]

if TYPE_CHECKING:
    from hpcbox.api import Entrant, Job, Project, Site, race
    from hpcbox.errors import FieldError, HpcboxError


def __getattr__(name: str) -> object:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'hpcbox' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
