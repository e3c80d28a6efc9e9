"""Shared test set-up. Fixtures live in tests/fixtures/, one module per area."""

from pathlib import Path

import pytest

pytest_plugins = [
    "tests.fixtures.engine",
    "tests.fixtures.debian",
    "tests.fixtures.images",
    "tests.fixtures.sif",
    "tests.fixtures.cluster",
    "tests.fixtures.submitting",
]

INTEGRATION = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(INTEGRATION):
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under pytest-xdist (`invoke test` runs two workers) the integration tests stay together on one
    worker, in order, since they share one engine's images, SIFs and cluster (session fixtures); the
    unit tests run on the other worker meanwhile, each test a unit of work of its own."""
    from xdist.scheduler import LoadScopeScheduling

    integration = f"{INTEGRATION.relative_to(config.rootpath).as_posix()}/"  # as node ids start

    class IntegrationTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "integration" if nodeid.startswith(integration) else nodeid

    return IntegrationTogether(config, log)
