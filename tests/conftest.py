"""Shared test set-up. Fixtures live in tests/fixtures/, one module per area."""

pytest_plugins = [
    "tests.fixtures.engine",
    "tests.fixtures.debian",
    "tests.fixtures.images",
    "tests.fixtures.sif",
    "tests.fixtures.cluster",
]
