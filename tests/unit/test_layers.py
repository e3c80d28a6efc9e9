"""The package's layers (docs/ARCHITECTURE.md, "Layers"): imports flow one way, down the pipeline.

Read from the source's own import statements (function-level ones included), so a new import that runs
back up fails here, not in review.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "hpcbox"
# Top first. A module may import its own stage, any stage below it, and tools/.
LAYERS = (
    "cli", "submitit", "testing", "api", "jobs", "survey", "store", "ledger", "report", "minicluster",
    "render", "sif", "build", "project", "base",
)  # fmt: skip
# The shared helpers at the bottom; the faces at the top (the program, users' `hpcbox.tasks`).
BASE = {"errors", "files", "tables", "units"}
FACES = {"__init__", "__main__", "tasks"}
MAX_TOP_LEVEL_MODULES = 12


def stage_of(module: str) -> str:
    """The stage of ``module`` (a dotted name under hpcbox): its package, or base/cli for top-level ones."""
    first = module.split(".")[1] if "." in module else "__init__"
    if not (PACKAGE / first).is_dir() and not (PACKAGE / f"{first}.py").is_file():
        first = "__init__"  # a name the package itself defines (hpcbox.__version__)
    if first in BASE:
        return "base"
    if first in FACES:
        return "cli"
    return first


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def hpcbox_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of hpcbox in ``path``; `from hpcbox import X` names hpcbox.X."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("hpcbox.")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "hpcbox":
                found += [(node.lineno, f"hpcbox.{alias.name}") for alias in node.names]
            elif node.module.startswith("hpcbox."):
                found.append((node.lineno, node.module))
    return found


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_import_flows_down_the_pipeline():
    broken = []
    for path in modules():
        here = stage_of(module_name(path))
        for line, target in hpcbox_imports(path):
            there = stage_of(target)
            if here == "tools":
                allowed = there == "tools" or target in ("hpcbox.errors", "hpcbox.files", "hpcbox.units")
            elif there == "tools":
                allowed = here != "base"
            else:
                allowed = there == here or LAYERS.index(there) > LAYERS.index(here)
            if not allowed:
                broken.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {here} imports {target} ({there})")
    assert broken == []


def test_every_stage_is_a_package_and_the_top_level_stays_small():
    top_level = sorted(path.stem for path in PACKAGE.glob("*.py"))
    assert len(top_level) <= MAX_TOP_LEVEL_MODULES, top_level
    assert set(top_level) <= BASE | FACES
    for stage in {*LAYERS, "tools"} - {"base"}:
        assert (PACKAGE / stage / "__init__.py").is_file(), stage


def test_the_reader_sees_imports_inside_functions_and_from_the_package(tmp_path: Path):
    """The test's own reader, on a file made for it: a missed import form would hide a broken layer."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from hpcbox import jobs, units\n"
        "import hpcbox.render.sbatch\n"
        "def f():\n"
        "    from hpcbox.cli.tasks import collection\n"
        "from . import nothing\n"
    )
    assert hpcbox_imports(sample) == [
        (1, "hpcbox.jobs"),
        (1, "hpcbox.units"),
        (2, "hpcbox.render.sbatch"),
        (4, "hpcbox.cli.tasks"),
    ]
    assert [stage_of(name) for _, name in hpcbox_imports(sample)] == ["jobs", "base", "render", "cli"]


def test_the_commands_about_jobs_stand_on_the_public_api():
    """`cli/` reaches jobs, the store, the site's survey, the ledger and the report only through hpcbox.api
    (Site, Job): the submit sequence exists once, there."""
    below_the_api = ("jobs", "survey", "store", "ledger", "report")
    reaching = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {target}"
        for path in sorted((PACKAGE / "cli").glob("*.py"))
        for line, target in hpcbox_imports(path)
        if stage_of(target) in below_the_api
    ]
    assert reaching == []
