"""hpcbox's own environment is locked: uv.lock matches pyproject.toml, and `./bootstrap` installs it."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.markers import Marker
from packaging.version import Version
from uv import find_uv_bin

REPO = Path(__file__).resolve().parents[2]
LOCK = tomllib.loads((REPO / "uv.lock").read_text())
PACKAGES = LOCK["package"]
UPDATE = "run `uv lock` (.venv/bin/uv lock), then `./bootstrap` to install what it pins"


def test_uv_lock_matches_pyproject_toml():
    # The committed files alone: no network, no uv settings of this machine's (an index of its own,
    # a mirror) that would make a lock of the same project differ.
    env = {name: value for name, value in os.environ.items() if not name.startswith("UV_")}
    checked = subprocess.run(
        [find_uv_bin(), "lock", "--check", "--offline", "--no-config", "--python", sys.executable],
        cwd=REPO, capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, f"uv.lock does not match pyproject.toml: {UPDATE}\n{checked.stderr}"


def test_uv_lock_names_only_the_public_index():
    registries = {p["source"]["registry"] for p in PACKAGES if "registry" in p["source"]}
    assert registries == {"https://pypi.org/simple"}, f"uv.lock names {sorted(registries)}: {UPDATE}"


def _locked_versions() -> dict[str, set[Version]]:
    """Every version uv.lock pins for this interpreter, by package (one, unless its markers split)."""
    versions: dict[str, set[Version]] = {}
    for package in PACKAGES:
        markers = package.get("resolution-markers", [])
        if not markers or any(Marker(marker).evaluate() for marker in markers):
            versions.setdefault(package["name"], set()).add(Version(package["version"]))
    return versions


def test_the_running_environment_has_the_versions_uv_lock_pins():
    differ = {}
    compared = set()
    for name, versions in _locked_versions().items():
        try:
            installed = Version(importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            continue  # pinned for another platform (pywin32, colorama)
        compared.add(name)
        if installed not in versions:
            differ[name] = f"{installed} installed, uv.lock pins {' or '.join(map(str, sorted(versions)))}"
    assert {"hpcbox", "pytest", "pytest-xdist", "ruff", "uv", "docker"} <= compared, sorted(compared)
    assert not differ, (
        f"{sys.prefix} does not have the versions uv.lock pins: {differ}; `./bootstrap` installs them "
        "(after `uv lock`, if pyproject.toml changed)"
    )
