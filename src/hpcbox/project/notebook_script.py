"""A Jupyter notebook as the script jobs run (`hpcbox init --from-notebook NB.ipynb`).

What `jupyter nbconvert --to script` does, which the course notes teach before a first batch job, with
what a batch job cannot run kept out: a cell with a shell escape (`!pip install`) or an IPython magic
(`%matplotlib`) is not Python, and a cell that shows a plot or a widget has no one to show it to. Such
a cell stays in the script as comments, under a line saying why, so the script reads as the notebook
does and nothing is lost. Markdown cells become comments too. The script must compile: a cell that is
not Python for another reason is named in one line, and nothing is written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from hpcbox.errors import HpcboxError

# A line that only IPython runs: a shell escape (`!ls`, `files = !ls`) or a magic (`%time`, `%%bash`).
_IPYTHON_ONLY = re.compile(r"^\s*(!|%|\w+\s*=\s*!)|get_ipython\(\)", re.MULTILINE)
# What shows something to a person: a batch job has no one to show it to.
_SHOWS = re.compile(r"\bplt\.show\(|\.show\(\)|\bdisplay\(|\bIPython\.display\b|\binteract\(|\bwidgets\.")
_HINT = "a notebook (.ipynb, nbformat 4) saved by Jupyter"


@dataclass(frozen=True)
class KeptOut:
    cell: int  # 1-based, counting every cell, as Jupyter's interface does
    why: str


@dataclass(frozen=True)
class NotebookScript:
    text: str
    kept_out: tuple[KeptOut, ...]
    code_cells: int


def convert(notebook: Path, shown: str = "") -> NotebookScript:
    """The script of ``notebook`` (``shown``: as the user named it); refuses (HpcboxError) a file that is
    not one, or one with no code."""
    shown = shown or str(notebook)
    try:
        data = json.loads(notebook.read_text(encoding="utf-8"))
    except FileNotFoundError as missing:
        raise HpcboxError(f"--from-notebook: {shown} does not exist", f"name {_HINT}") from missing
    except (OSError, UnicodeDecodeError, ValueError) as unreadable:
        raise HpcboxError(f"--from-notebook: {shown} is not a notebook (not JSON)", f"name {_HINT}") from (
            unreadable
        )
    if not isinstance(data, dict) or data.get("nbformat") != 4 or not isinstance(data.get("cells"), list):
        raise HpcboxError(
            f"--from-notebook: {shown} is not an nbformat 4 notebook",
            "open and save it in a current Jupyter, or convert it with `jupyter nbconvert --to notebook`",
        )
    parts = [
        f"# The program of {notebook.name}, written by `hpcbox init --from-notebook` (as `jupyter nbconvert\n"
        "# --to script` writes it): what a batch job cannot run is kept out as comments, saying why.\n"
    ]
    kept_out, code_cells = [], 0
    for number, cell in enumerate(data["cells"], start=1):
        if not isinstance(cell, dict):
            continue
        source = cell.get("source", "")
        text = "".join(source) if isinstance(source, list) else str(source)
        if cell.get("cell_type") == "markdown" and text.strip():
            parts.append(_commented(text))
        elif cell.get("cell_type") == "code" and text.strip():
            why = _why_kept_out(text)
            if why:
                kept_out.append(KeptOut(number, why))
                parts.append(f"# In[{number}]: kept out: {why}\n{_commented(text)}")
            else:
                code_cells += 1
                parts.append(f"# In[{number}]:\n{text.rstrip()}\n")
    if not code_cells:
        raise HpcboxError(
            f"--from-notebook: {shown} has no code cell a batch job can run",
            "a job needs Python cells without shell escapes, magics or plots",
        )
    script = "\n\n".join(parts)
    try:
        compile(script, notebook.with_suffix(".py").name, "exec")
    except SyntaxError as wrong:
        cell = _cell_at(script, wrong.lineno or 0)
        raise HpcboxError(
            f"--from-notebook: cell {cell} of {notebook.name} is not Python ({wrong.msg})",
            "fix that cell in Jupyter, or clear it, and init again",
        ) from wrong
    return NotebookScript(script, tuple(kept_out), code_cells)


def _why_kept_out(text: str) -> str:
    if _IPYTHON_ONLY.search(text):
        return "a shell escape or IPython magic (`!`, `%`), which only IPython runs"
    if _SHOWS.search(text):
        return "it shows a plot or widget, which a batch job has no one to show to"
    return ""


def _commented(text: str) -> str:
    return "".join(f"# {line}".rstrip() + "\n" for line in text.rstrip().splitlines())


def _cell_at(script: str, line: int) -> str:
    """The cell number of the `# In[N]:` header at or above ``line`` of ``script``."""
    headers = [re.match(r"# In\[(\d+)\]", text) for text in script.splitlines()[:line]]
    numbers = [match[1] for match in headers if match]
    return numbers[-1] if numbers else "?"
