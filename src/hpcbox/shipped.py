"""The files hpcbox ships beside its code: cluster profiles, the image's Dockerfile and locks, the SIF
helper's, and the mini cluster's node image.

An installed hpcbox carries them as package data (hpcbox/shipped/); a source checkout, or an editable
install of one, reads this repository's own folders, which the package data is made from
(pyproject.toml's package-dir).
"""

from __future__ import annotations

from pathlib import Path

_PACKAGED = Path(__file__).resolve().parent / "shipped"
_CHECKOUT = Path(__file__).resolve().parents[2]
_FOLDERS = {
    "clusters": "slurm/clusters",
    "docker": "docker",
    "apptainer": "apptainer",
    "node": "containers/node",
}


def shipped(name: str) -> Path:
    """The folder of shipped files called ``name`` (one of clusters, docker, apptainer, node)."""
    packaged = _PACKAGED / name
    return packaged if packaged.is_dir() else _CHECKOUT / _FOLDERS[name]
