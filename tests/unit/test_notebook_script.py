"""`hpcbox init --from-notebook`: a notebook's script, run here by this machine's Python; bad input in
one line, with nothing written. The script as a job runs it: tests/integration/test_own_project.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcbox.errors import HpcboxError
from hpcbox.project.init import apply, plan_init
from hpcbox.project.notebook_script import convert


def cell(kind: str, *lines: str) -> dict:
    extra = {"outputs": [], "execution_count": None} if kind == "code" else {}
    return {"cell_type": kind, "metadata": {}, "source": list(lines), **extra}


def notebook(path: Path, *cells: dict, nbformat: int = 4) -> Path:
    path.write_text(
        json.dumps({"nbformat": nbformat, "nbformat_minor": 5, "metadata": {}, "cells": list(cells)})
    )
    return path


ANALYSIS = (
    cell("markdown", "# Totals\n", "Adds up."),
    cell("code", "!pip install tqdm"),
    cell("code", "import sys\n", "from pathlib import Path\n", "total = sum(range(5))"),
    cell("code", "%%time\n", "total += 0"),
    cell("code", "files = !ls\n"),
    cell("code", "import matplotlib.pyplot as plt\n", "plt.plot([total])\n", "plt.show()"),
    cell("code", "display(total)"),
    cell("code", "Path(sys.argv[1]).write_text(str(total))"),
)


def test_the_script_runs_what_a_batch_job_can_and_keeps_the_rest_as_comments(tmp_path: Path):
    converted = convert(notebook(tmp_path / "analysis.ipynb", *ANALYSIS))
    assert [(kept.cell, kept.why.split(",")[0]) for kept in converted.kept_out] == [
        (2, "a shell escape or IPython magic (`!`"),
        (4, "a shell escape or IPython magic (`!`"),
        (5, "a shell escape or IPython magic (`!`"),
        (6, "it shows a plot or widget"),
        (7, "it shows a plot or widget"),
    ]
    assert converted.code_cells == 2
    script = tmp_path / "analysis.py"
    script.write_text(converted.text)
    ran = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "total")], capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "total").read_text() == "10"
    assert "# # Totals\n# Adds up.\n" in converted.text  # markdown, as comments
    assert "# In[2]: kept out: a shell escape" in converted.text and "# !pip install tqdm\n" in converted.text


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "does not exist"),
        ("{not json", "is not a notebook (not JSON)"),
        (json.dumps({"nbformat": 3, "worksheets": []}), "is not an nbformat 4 notebook"),
        (json.dumps({"nbformat": 4, "cells": [cell("markdown", "# only words")]}), "has no code cell"),
        (json.dumps({"nbformat": 4, "cells": [cell("code", "!ls")]}), "has no code cell a batch job can run"),
        (
            json.dumps({"nbformat": 4, "cells": [cell("code", "x = 1"), cell("code", "def f(:\n")]}),
            "cell 2 of",
        ),
    ],
)
def test_a_file_that_is_no_runnable_notebook_is_one_line_and_nothing_is_written(
    tmp_path: Path, content: str | None, says: str
):
    (tmp_path / "requirements.txt").write_text("numpy\n")
    if content is not None:
        (tmp_path / "nb.ipynb").write_text(content)
    before = sorted(path.name for path in tmp_path.iterdir())
    with pytest.raises(HpcboxError) as refused:
        plan_init(tmp_path, from_notebook="nb.ipynb")
    assert says in refused.value.message and "\n" not in refused.value.message
    assert sorted(path.name for path in tmp_path.iterdir()) == before


def test_init_from_a_notebook_writes_its_script_and_names_it_the_program(tmp_path: Path):
    (tmp_path / "requirements.txt").write_text("numpy\n")
    (tmp_path / "work").mkdir()
    notebook(tmp_path / "work" / "analysis.ipynb", *ANALYSIS)
    plan = plan_init(tmp_path, from_notebook="work/analysis.ipynb", args=("{output_dir}/total",))
    lines = apply(tmp_path, plan)
    assert "added work/analysis.py" in lines
    table = (tmp_path / "pyproject.toml").read_text()
    assert 'script = "work/analysis.py"' in table and 'code = ["work"]' in table, table
    assert "work/analysis.py: cell 6 kept out as comments: it shows a plot" in "\n".join(plan.notes)


@pytest.mark.parametrize(
    ("setup", "flags", "says"),
    [
        ("script", {"from_notebook": "nb.ipynb"}, "nb.py exists: init does not overwrite it"),
        ("configured", {"from_notebook": "nb.ipynb"}, "hpcbox is set up here already"),
        ("", {"from_notebook": "../nb.ipynb"}, "is outside the project"),
        ("", {"from_notebook": "nb.ipynb", "program": "train.py"}, "--from-notebook names the program"),
    ],
)
def test_init_from_a_notebook_refuses_what_it_would_overwrite_or_cannot_do(
    tmp_path: Path, setup: str, flags: dict, says: str
):
    from hpcbox.project.init import Program

    root = tmp_path / "project"
    root.mkdir()
    (root / "requirements.txt").write_text("numpy\n")
    notebook(root / "nb.ipynb", cell("code", "x = 1"))
    notebook(tmp_path / "nb.ipynb", cell("code", "x = 1"))
    if setup == "script":
        (root / "nb.py").write_text("mine\n")
    if setup == "configured":
        (root / "pyproject.toml").write_text('[tool.hpcbox]\nproject = "p"\n')
    before = sorted(path.name for path in root.iterdir())
    program = Program("script", flags["program"]) if "program" in flags else None
    with pytest.raises(HpcboxError) as refused:
        plan_init(root, from_notebook=flags["from_notebook"], program=program)
    assert says in refused.value.message
    assert sorted(path.name for path in root.iterdir()) == before
