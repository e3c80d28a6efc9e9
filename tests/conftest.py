"""Shared test set-up. Fixtures live in tests/fixtures/, one module per area."""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Generator

    from tests.fixtures.buildcache import SuiteBuildCache

pytest_plugins = [
    "tests.fixtures.engine",
    "tests.fixtures.debian",
    "tests.fixtures.images",
    "tests.fixtures.sif",
    "tests.fixtures.cluster",
    "tests.fixtures.submitting",
]

REPO = Path(__file__).resolve().parents[1]
INTEGRATION = Path(__file__).parent / "integration"

# The integration modules in lanes: under `invoke test` each lane runs on an xdist worker of its own, its
# modules in this order, with session fixtures of its own (a lane's cluster is its own), while the unit
# tests fill in where a lane ends first. The jobs that wait out a time limit start first, the builds
# that fill both cores (a base bootstrapped, an image rebuilt with no cache) come last in theirs; the
# images, the environment's SIF and the dataset are made once per run for every lane
# (tests/fixtures/engine.py). The lanes' lengths, from the last full run: bench/results/suite.json.
LANES = {
    "cluster jobs": (
        "test_sbatch_cluster",
        "test_node_loss",
        "test_submit_faults",
        "test_ssh_master",
        "test_cluster_sharing",
        "test_minicluster",
    ),
    "cluster submits": (
        "test_submit",
        "test_job_identity",
        "test_upload",
    ),
    "own projects": (
        "test_own_project",
        "test_api",
        "test_executor",
        "test_upload_access",
        "test_upload_full",
        "test_doctor",
    ),
    "other clusters": (
        "test_slurm_2205",
        "test_slurm_2605",
        "test_container_software",
        "test_rehearsal",
        "test_notebook",
    ),
    "images and builds": (
        "test_trainer",
        "test_lock",
        "test_verify",
        "test_image",
        "test_sif",
        "test_registry_base",
        "test_reproducible",
        "test_base",
    ),
}
_LANE_OF = {module: lane for lane, modules in LANES.items() for module in modules}
_PLACE = {module: place for modules in LANES.values() for place, module in enumerate(modules)}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hpcbox")
    group.addoption(
        "--reverse-modules",
        action="store_true",
        help="run each lane's integration modules in reverse order (each module must pass after any other)",
    )
    group.addoption(
        "--record-durations",
        action="store_true",
        help="write each module's seconds and outcomes to bench/results/suite.json and docs/testing.md",
    )
    group.addoption(
        "--record-cpu",
        action="store_true",
        help="with --record-durations: the kernel's process accounting on for the run (root only), its CPU "
        "by where it ran and by program into the same results (bench/suite_cpu.py)",
    )


def lane_of(path: Path) -> str:
    """The lane of an integration module; a module in no lane is refused, so that none runs unplaced."""
    if path.stem not in _LANE_OF:
        raise pytest.UsageError(f"{path.name}: in no lane of tests/conftest.py's LANES: add it to one")
    return _LANE_OF[path.stem]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reverse = config.getoption("--reverse-modules")

    def place(indexed: tuple[int, pytest.Item]) -> tuple:
        index, item = indexed
        if not item.path.is_relative_to(INTEGRATION):
            return (1, 0, index)
        module_place = _PLACE[item.path.stem]  # every integration module has one: lane_of refused the rest
        return (0, -module_place if reverse else module_place, index)

    for item in items:
        if item.path.is_relative_to(INTEGRATION):
            lane_of(item.path)
            item.add_marker(pytest.mark.integration)
    items[:] = [item for _, item in sorted(enumerate(items), key=place)]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`--numprocesses=auto` (`invoke test`): a worker for each lane."""
    return len(LANES)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under pytest-xdist each lane of integration modules is one unit of work, kept on one worker in
    order; each unit test is a unit of its own, given to whichever worker is free."""
    from xdist.scheduler import LoadScopeScheduling

    integration = f"{INTEGRATION.relative_to(config.rootpath).as_posix()}/"  # as node ids start

    class Lanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if not nodeid.startswith(integration):
                return nodeid
            return lane_of(Path(nodeid.split("::", 1)[0]))

    return Lanes(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Generator[None, pytest.TestReport]:
    """A test failed by an `HpcboxError` shows its details too (a build step's last lines, a command's
    output), which its one-line message leaves out: the cause of a failure seen once in a full run."""
    from hpcbox.errors import HpcboxError

    report = yield
    failed = call.excinfo.value if call.excinfo is not None else None
    while failed is not None and not (isinstance(failed, HpcboxError) and failed.details):
        failed = failed.__cause__ or failed.__context__
    if report.failed and failed is not None:
        report.sections.append(("hpcbox error details", failed.details))
    return report


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--record-durations") and not hasattr(config, "workerinput"):  # xdist's controller
        from tests.fixtures.buildcache import SuiteBuildCache

        accounting = None
        if config.getoption("--record-cpu"):
            accounting = _bench("suite_cpu").Accounting(
                Path(tempfile.mkdtemp(prefix="hpcbox-pacct-")) / "pacct"
            )
        durations = SuiteDurations(SuiteBuildCache.begin(), accounting)
        config.pluginmanager.register(durations, "hpcbox-suite-durations")


class SuiteDurations:
    """Every test's phases as reported, summed per module, written as bench/results/suite.json (through
    bench/run.py, which also rewrites docs/testing.md's tables from it): each integration module's lane,
    tests, outcomes and seconds, each lane's wall time, and the whole run's; in its details, each
    integration test's outcome and seconds (set-up and tear-down included), slowest first; and the run
    added to the file's history of every full run (bench/suite_history.py), with how it was made as the
    runner says it (HPCBOX_SUITE_NOTE="fresh clone, engine wiped"), whether its modules ran reversed and
    the machine's kernel and speeds as it started (bench/machine_speed.py).
    At the end, the run's ``build_cache`` tidied (tests/fixtures/buildcache.py), what the suite's runs
    keep a row; with ``accounting`` (bench/suite_cpu.py's, `--record-cpu`), the run's CPU by where it ran
    and by program, rows too."""

    def __init__(self, build_cache: SuiteBuildCache | None = None, accounting=None) -> None:
        self.build_cache = build_cache
        self.accounting = accounting
        self.accounting_refused = accounting.start() if accounting is not None else None
        self.started = datetime.datetime.now(datetime.UTC)
        self.load_1min = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        self.machine = _bench("machine_speed").measure()  # before the lanes start: about a second
        self.errors: set[str] = set()  # failed outside their call (set-up, tear-down): pytest's errors
        self.seconds: dict[str, float] = defaultdict(float)
        self.test_seconds: dict[str, float] = defaultdict(float)
        self.outcomes: dict[str, dict[str, str]] = defaultdict(dict)
        self.spans: dict[str, list[float]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = report.nodeid.split("::", 1)[0]
        self.seconds[module] += report.duration
        self.test_seconds[report.nodeid] += report.duration
        outcomes = self.outcomes[module]
        if report.failed:
            if report.when == "call":
                self.errors.discard(report.nodeid)
            elif outcomes.get(report.nodeid) != "failed":  # its first failure, outside its call
                self.errors.add(report.nodeid)
            outcomes[report.nodeid] = "failed"
        elif report.when == "call" or report.skipped:
            outcomes.setdefault(report.nodeid, report.outcome)
        if (lane := _lane(module)) is not None:
            span = self.spans.setdefault(lane, [report.start, report.stop])
            span[0], span[1] = min(span[0], report.start), max(span[1], report.stop)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        wall = (datetime.datetime.now(datetime.UTC) - self.started).total_seconds()
        cpu_rows = self._cpu_rows(session, wall)  # accounting off first: whatever follows may raise
        every = [outcome for tests in self.outcomes.values() for outcome in tests.values()]
        rows = [_row("the whole suite, wall clock", wall / 60, "min", _counted(every), target="≤ 25 min")]
        for lane in LANES:
            if lane in self.spans:
                start, stop = self.spans[lane]
                rows.append(
                    _row(f"lane: {lane}", (stop - start) / 60, "min", "its modules one after another")
                )
        unit = [module for module in self.seconds if _lane(module) is None]
        for module in sorted(set(self.seconds) - set(unit), key=lambda name: -self.seconds[name]):
            tests = list(self.outcomes[module].values())
            note = f"{_lane(module)}: {_counted(tests)}"
            rows.append(_row(Path(module).name, self.seconds[module], "s", note))
        unit_tests = [outcome for module in unit for outcome in self.outcomes[module].values()]
        seconds = sum(self.seconds[module] for module in unit)
        rows.append(
            _row("tests/unit, every module", seconds, "s", f"beside the lanes: {_counted(unit_tests)}")
        )
        if self.build_cache is not None:
            whole = exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)  # not interrupted
            tidied = self.build_cache.tidy(remove=whole)
            session.config.pluginmanager.get_plugin("terminalreporter").write_line(f"hpcbox: {tidied}")
            rows.append(
                _row("Docker build cache the suite's runs keep, after this run", tidied.kept_bytes / 1e9,
                     "GB",
                     f"{tidied.kept} records; {tidied.removed} ({tidied.removed_bytes / 1e9:.1f} GB) "
                     "removed: made by earlier runs and unused by this one, or the oldest over the bound")
            )  # fmt: skip
        rows += cpu_rows
        runner, history = _bench("run"), _bench("suite_history")
        tests = {}
        for nodeid, seconds in sorted(self.test_seconds.items(), key=lambda item: -item[1]):
            module = nodeid.split("::", 1)[0]
            if _lane(module) is not None:
                tests[nodeid] = {
                    "outcome": self.outcomes[module].get(nodeid, "not run"),
                    "seconds": round(seconds, 1),
                }
        commit = runner.measured_at()
        run = history.entry(
            commit=commit,
            started=self.started.isoformat(timespec="seconds"),
            finished=(self.started + datetime.timedelta(seconds=wall)).isoformat(timespec="seconds"),
            minutes=wall / 60,
            outcomes={test: outcome for each in self.outcomes.values() for test, outcome in each.items()},
            errors=self.errors,
            lanes_min={
                lane: (self.spans[lane][1] - self.spans[lane][0]) / 60 for lane in LANES if lane in self.spans
            },
            how=os.environ.get(history.NOTE_VARIABLE, "").strip() or None,
            reverse=session.config.getoption("--reverse-modules"),
            load_1min=self.load_1min,
            machine=self.machine,
            exit_status=int(exitstatus),
        )
        earlier = json.loads(history.SUITE.read_text()) if history.SUITE.exists() else None
        runner.record(
            "suite",
            self.started,
            rows,
            details={"integration tests": tests},
            commit=commit,
            history=history.added(history.history(earlier) if earlier else [], run),
        )

    def _cpu_rows(self, session: pytest.Session, wall_s: float) -> list[dict]:
        """The run's CPU from its process accounting (none where it was not asked for or not allowed)."""
        if self.accounting is None:
            return []
        say = session.config.pluginmanager.get_plugin("terminalreporter").write_line
        if self.accounting_refused:
            say(f"hpcbox: {self.accounting_refused}")
            return []
        self.accounting.stop()
        cpu = _bench("suite_cpu")
        daemons = {
            name: seconds - self.accounting.daemons_at_start.get(name, 0.0)
            for name, seconds in cpu.daemons_cpu_s().items()
        }
        try:
            return cpu.rows(cpu.read(self.accounting.path), daemons, wall_s, os.cpu_count() or 1)
        finally:
            shutil.rmtree(self.accounting.path.parent, ignore_errors=True)


def _bench(name: str):
    """bench/NAME.py as a module of its own (bench/ is no package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pytest_terminal_summary(terminalreporter) -> None:
    """Which enforcement each enforcement test checked (tests/fixtures/cluster.py's ``enforced_by``):
    the cgroup kill where the engine gives the nodes cgroups, Slurm's accounting kill where not."""
    from tests.fixtures.cluster import ENFORCED_BY

    checked = [
        (report.nodeid, value)
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        for key, value in getattr(report, "user_properties", ())
        if key == ENFORCED_BY
    ]
    if checked:
        terminalreporter.section("enforcement checked on this engine")
        for nodeid, said in sorted(checked):
            terminalreporter.line(f"{nodeid}: {said}")


def _lane(module: str) -> str | None:
    path = REPO / module
    return lane_of(path) if path.is_relative_to(INTEGRATION) else None


def _counted(outcomes: list[str]) -> str:
    return ", ".join(f"{outcomes.count(outcome)} {outcome}" for outcome in sorted(set(outcomes)))


def _row(metric: str, value: float, unit: str, note: str, target: str = "") -> dict:
    return {"metric": metric, "value": round(value, 1), "unit": unit, "target": target, "note": note}
