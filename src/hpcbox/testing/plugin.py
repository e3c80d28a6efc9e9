"""hpcbox's pytest plugin (the `pytest11` entry point): the `hpcbox_cluster` fixture, a mini Slurm
cluster for the test session of a project hpcbox takes to a cluster.

testcontainers' convention: one session-scoped fixture per service, started by the first test that asks
for it and removed at the session's end, also when the session is interrupted (pytest tears the session
down after Ctrl-C; SIGTERM, as a CI runner cancelling a job sends it, is turned into the same interrupt
while the cluster is up). A session that asks for no cluster gets nothing from this plugin but its
options: loading it imports neither the Docker SDK nor the rest of hpcbox.

Options (the command line's over the ini file's, `[tool.pytest.ini_options]` or pytest.ini):
`hpcbox_cluster` / `--hpcbox-cluster`: the profile the cluster is shaped like (default `local`);
`hpcbox_slurm` / `--hpcbox-slurm`: the Slurm version its nodes run (default: the nearest to the
profile's `[slurm] version`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from hpcbox.errors import HpcboxError
from hpcbox.testing.cluster import DEFAULT_PROFILE, ClusterSettings

if TYPE_CHECKING:
    from hpcbox.testing.cluster import SessionCluster

PROFILE_INI, SLURM_INI = "hpcbox_cluster", "hpcbox_slurm"
PROFILE_FLAG, SLURM_FLAG = "--hpcbox-cluster", "--hpcbox-slurm"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hpcbox", "hpcbox: the mini Slurm cluster of the hpcbox_cluster fixture")
    group.addoption(
        PROFILE_FLAG,
        dest="hpcbox_cluster_profile",
        metavar="PROFILE",
        help=f"the cluster profile the session's mini cluster is shaped like (over the {PROFILE_INI} ini "
        f"option; default {DEFAULT_PROFILE})",
    )
    group.addoption(
        SLURM_FLAG,
        dest="hpcbox_cluster_slurm",
        metavar="VERSION",
        help=f"the Slurm version the session's mini cluster runs (over the {SLURM_INI} ini option; "
        "default: the nearest to the profile's)",
    )
    parser.addini(
        PROFILE_INI,
        f"hpcbox_cluster fixture: the profile its mini cluster is shaped like (default {DEFAULT_PROFILE})",
        default=DEFAULT_PROFILE,
    )
    parser.addini(
        SLURM_INI,
        "hpcbox_cluster fixture: the Slurm version its mini cluster runs (default: the profile's nearest)",
        default="",
    )


def settings_of(config: pytest.Config) -> ClusterSettings:
    """The session's cluster settings: each option from the command line, else the ini file, else its
    default; checked, an error naming the option as it was set."""
    profile, profile_field = _option(config, "hpcbox_cluster_profile", PROFILE_FLAG, PROFILE_INI)
    slurm, slurm_field = _option(config, "hpcbox_cluster_slurm", SLURM_FLAG, SLURM_INI)
    settings = ClusterSettings(profile or DEFAULT_PROFILE, slurm or None)
    return settings.checked(profile_field=profile_field, slurm_field=slurm_field)


def _option(config: pytest.Config, dest: str, flag: str, ini: str) -> tuple[str, str]:
    """An option's value (stripped; empty: unset) and its name as the user set it."""
    given = config.getoption(dest)
    if given is not None:
        return str(given).strip(), flag
    return str(config.getini(ini)).strip(), ini


@pytest.fixture(scope="session")
def hpcbox_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SessionCluster]:
    """A mini Slurm cluster for this session, shaped like the `hpcbox_cluster` profile and running the
    `hpcbox_slurm` version, named `hpcbox-pytest-<random>`; its handle submits the project's job there
    (`.submit`, `.job`, `.site`), runs commands on its login node (`.run`). Removed at the session's end,
    its keys with it."""
    from hpcbox.testing import cluster as session

    say = _terminal(request.config)
    try:
        settings = settings_of(request.config)
    except HpcboxError as exc:
        pytest.fail(f"hpcbox_cluster: {exc}", pytrace=False)
    folder = tmp_path_factory.mktemp("hpcbox-cluster")
    try:
        with session.running(settings, request.config.rootpath, folder, say=say) as handle:
            yield handle
    except HpcboxError as exc:  # the start's or the removal's: the tests' own errors stay in the tests
        pytest.fail(f"hpcbox_cluster: {exc}", pytrace=False)


def _terminal(config: pytest.Config) -> Callable[[str], None]:
    """Lines to the terminal as they happen, past pytest's capture (a cluster takes a while to start);
    stderr where there is no terminal reporter (an xdist worker)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")

    def say(line: str) -> None:
        if reporter is None:
            print(line, file=sys.stderr, flush=True)
            return
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            reporter.write_line(line)
            reporter.flush()

    return say
