"""The running script's (or notebook's) functions and classes as their source, so that a call made of
them runs on whatever Python the environment has, not only on the laptop's minor version.

The node must define them again without running the script's other statements: the driver (the
executor, its submits, a training run at the top level) runs on the laptop alone. So the script is
parsed and only what defines something is kept: its imports (those the kept code uses), its top-level
`def`s and `class`es (and those directly inside `if __name__ == "__main__":`), and its simple
assignments (constants: no call anywhere in them but inside a lambda, and only names already defined).
Kept statements stay on their own lines, so a traceback on the node names the script's line numbers.

A name the kept code reads that another statement of the script sets (`log = logging.getLogger()`,
`model = Net()`, a constant the driver changed, an import inside `try:`) travels as data: its value on
the laptop, pickled, as cloudpickle would send it. What has no source of its own at the top level (a
lambda, a nested function, a closure) is not found here: `NoSource` names it.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import io
import pickle
import symtable
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# In the call's folder (the job's dataset): the definitions, as <script name>.py, and the values of the
# names they read that travel as data. The runner (run_call.py) knows the same names.
SCRIPT_DIR = "script"
GLOBALS = "globals.pkl"
NOTEBOOK_FILE = "notebook.py"
# Where the running script may be something else than a file: `python -c`, the interactive prompt.
_NO_FILE = ("<string>", "<stdin>")


class NoSource(Exception):
    """``obj`` (a lambda, a nested function or class, a closure) has no source at a script's top level."""

    def __init__(self, obj: Any) -> None:
        super().__init__(getattr(obj, "__qualname__", repr(obj)))
        self.obj = obj


@dataclass(frozen=True)
class ScriptSource:
    """The running script's definitions, as the node runs them."""

    origin: str  # the script's file name, or "the notebook"
    file_name: str  # the definitions' file on the node
    text: str
    defined: frozenset[str]  # the names the text binds
    reads: frozenset[str]  # the global names the text's code reads
    rebound: frozenset[str]  # names the script's other statements (or a `global` statement) set
    imports: tuple[str, ...]  # the top-level modules the text imports, in order
    lines: dict[str, int]  # where the script first binds each name, for messages

    def data_names(self, namespace: dict[str, Any]) -> list[str]:
        """The names whose values travel as data: read by the kept code, set by code that does not run
        on the node, and set here."""
        wanted = self.reads & (self.rebound | (namespace.keys() - self.defined))
        return sorted(name for name in wanted if name in namespace and not name.startswith("__"))

    def where(self, name: str) -> str:
        line = self.lines.get(name)
        return f"{self.origin} line {line}" if line else self.origin


def running_script() -> ScriptSource | None:
    """The definitions of `__main__`: a script file's, or a notebook's (IPython's cell history); None
    where there is no source to read (`python -c`, the interactive prompt)."""
    shell = _ipython_shell()
    if shell is not None:
        cells = [cell for cell in shell.history_manager.input_hist_parsed if cell.strip()]
        return definitions(cells, "the notebook", NOTEBOOK_FILE)
    file = getattr(sys.modules.get("__main__"), "__file__", None)
    if not file or file in _NO_FILE or not file.endswith(".py") or not Path(file).is_file():
        return None
    return definitions([Path(file).read_text()], Path(file).name, Path(file).name)


def _ipython_shell() -> Any:
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell if shell is not None and shell.user_module is sys.modules.get("__main__") else None


def definitions(sources: list[str], origin: str, file_name: str) -> ScriptSource:
    """What of ``sources`` (a script, or a notebook's cells in the order they ran) defines something,
    as the text the node runs."""
    texts, defined, rebound, lines, offset = [], set(), set(), {}, 0
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue  # a notebook cell IPython ran as something else than Python
        kept, dropped = _split(tree.body)
        texts.append(_keep(source, kept))
        for statement, _ in kept:
            defined |= _bound(statement)
        for statement in dropped:
            rebound |= _bound(statement)
        rebound |= {name for node in ast.walk(tree) if isinstance(node, ast.Global) for name in node.names}
        for statement in tree.body:
            for name in _bound(statement):
                lines.setdefault(name, offset + statement.lineno)
        offset += len(source.splitlines())
    text = "\n".join(texts)
    reads = _reads(text, file_name)
    text = _without_unused_imports(text, reads, file_name)
    imports = tuple(
        dict.fromkeys(
            (alias.name if isinstance(node, ast.Import) else node.module or "").split(".")[0]
            for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.Import | ast.ImportFrom) and not getattr(node, "level", 0)
            for alias in node.names
        )
    )
    return ScriptSource(
        origin, file_name, text, frozenset(defined), frozenset(reads), frozenset(rebound), imports, lines
    )


def _split(body: list[ast.stmt]) -> tuple[list[tuple[ast.stmt, int]], list[ast.stmt]]:
    """The statements kept (each with its indentation on the node: 0, or the main guard's body's) and
    those dropped; the main guard's own line is kept as `if True:` where its body keeps something."""
    kept: list[tuple[ast.stmt, int]] = []
    dropped: list[ast.stmt] = []
    available = set(dir(builtins))
    for statement in body:
        if _is_main_guard(statement):
            assert isinstance(statement, ast.If)
            inside = [part for part in statement.body if _keepable(part, available)]
            for part in statement.body:
                if part in inside:
                    available |= _bound(part)
                else:
                    dropped.append(part)
            dropped.extend(statement.orelse)
            on_its_line = statement.body[0].lineno == statement.lineno  # `if __name__ == "__main__": x()`
            if inside and not on_its_line:
                kept.append((statement, 0))
            kept.extend((part, 0 if on_its_line else inside[0].col_offset) for part in inside)
        elif _keepable(statement, available):
            kept.append((statement, 0))
            available |= _bound(statement)
        else:
            dropped.append(statement)
    return kept, dropped


def _is_main_guard(statement: ast.stmt) -> bool:
    if not isinstance(statement, ast.If) or not isinstance(statement.test, ast.Compare):
        return False
    test = statement.test
    sides = [test.left, *test.comparators]
    names = [side.id for side in sides if isinstance(side, ast.Name)]
    constants = [side.value for side in sides if isinstance(side, ast.Constant)]
    return isinstance(test.ops[0], ast.Eq) and names == ["__name__"] and constants == ["__main__"]


def _keepable(statement: ast.stmt, available: set[str]) -> bool:
    """Whether ``statement`` only defines: an import, a def, a class, or a simple assignment."""
    if isinstance(statement, ast.Import | ast.ImportFrom | ast.FunctionDef | ast.AsyncFunctionDef):
        return True
    if isinstance(statement, ast.ClassDef):
        return True
    if isinstance(statement, ast.Assign):
        targets_plain = all(isinstance(target, ast.Name) for target in statement.targets)
        return targets_plain and _simple(statement.value, available)
    if isinstance(statement, ast.AnnAssign) and statement.value is not None:
        return isinstance(statement.target, ast.Name) and _simple(statement.value, available)
    return False


def _simple(value: ast.expr, available: set[str]) -> bool:
    """A constant's value: no call, await, yield or `:=` (but inside a lambda, which runs later), and
    only names defined before it."""
    pending = [value]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Call | ast.Await | ast.Yield | ast.YieldFrom | ast.NamedExpr):
            return False
        if isinstance(node, ast.comprehension | ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
            return False  # their loop's names and iteration: not a constant's
        if isinstance(node, ast.Name) and node.id not in available:
            return False
        pending.extend(ast.iter_child_nodes(node))
    return True


def _bound(statement: ast.stmt) -> set[str]:
    """The names ``statement`` binds in its own scope (not in the functions or classes it defines)."""
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {statement.name}
    if isinstance(statement, ast.Import | ast.ImportFrom):
        return {alias.asname or alias.name.split(".")[0] for alias in statement.names if alias.name != "*"}
    found: set[str] = set()
    pending: list[ast.AST] = [statement]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            found.add(node.id)
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            found.add(node.name)
        if node is not statement and isinstance(node, ast.stmt):
            found |= _bound(node)  # a def, class or import inside a block: its name, not its body
            continue
        if isinstance(node, ast.Lambda):
            continue
        pending.extend(ast.iter_child_nodes(node))
    return found


def _keep(source: str, kept: list[tuple[ast.stmt, int]]) -> str:
    """``source`` with only the ``kept`` statements, each on its own lines; a statement that shares a
    line with another is written out again (`ast.unparse`) on its first line, so that no dropped
    statement comes along."""
    lines = source.splitlines()
    out = [""] * len(lines)
    spans = {id(statement): _span(statement) for statement, _ in kept}
    for statement, indent in kept:
        first, last = spans[id(statement)]
        if _is_main_guard(statement):
            out[first - 1] = "if True:"  # the main block: its definitions alone follow
            continue
        if _shares_a_line(statement, first, last, lines):
            joined = out[first - 1].strip()
            written = ast.unparse(statement)
            out[first - 1] = " " * indent + (f"{joined}; {written}" if joined else written)
            continue
        out[first - 1 : last] = lines[first - 1 : last]
    return "\n".join(out) + "\n"


def _span(statement: ast.stmt) -> tuple[int, int]:
    decorators = getattr(statement, "decorator_list", [])
    first = min([statement.lineno, *(decorator.lineno for decorator in decorators)])
    return first, statement.end_lineno or statement.lineno


def _shares_a_line(statement: ast.stmt, first: int, last: int, lines: list[str]) -> bool:
    """Whether something else than ``statement`` stands on its first or last line (`import os; main()`)."""
    assert statement.end_col_offset is not None
    before = lines[first - 1][: statement.col_offset].strip() if first == statement.lineno else ""
    after = lines[last - 1][statement.end_col_offset :].strip()
    return bool(before) or (bool(after) and not after.startswith("#"))


def _reads(text: str, file_name: str) -> set[str]:
    """The global names the code of ``text`` reads, in any of its scopes (as the compiler sees them)."""
    found: set[str] = set()
    pending = [symtable.symtable(text, file_name, "exec")]
    while pending:
        table = pending.pop()
        module_level = table.get_type() == "module"  # there every name is global
        found |= {
            symbol.get_name()
            for symbol in table.get_symbols()
            if symbol.is_referenced() and (module_level or symbol.is_global())
        }
        pending.extend(table.get_children())
    return found


def _without_unused_imports(text: str, reads: set[str], file_name: str) -> str:
    """``text`` without the imports whose names its code never reads (the driver's `import submitit`,
    say, which the environment need not have)."""
    lines = text.splitlines()
    for node in ast.parse(text, file_name).body:
        main_block = isinstance(node, ast.If) and isinstance(node.test, ast.Constant)  # `if True:`
        statements = node.body if main_block else [node]  # type: ignore[attr-defined]
        removed = [statement for statement in statements if _unused_import(statement, reads, lines)]
        for statement in removed:
            first, last = _span(statement)
            lines[first - 1 : last] = [""] * (last - first + 1)
        if main_block and len(removed) == len(statements):
            lines[node.lineno - 1] = ""  # nothing left in it
    return "\n".join(lines) + "\n"


def _unused_import(statement: ast.stmt, reads: set[str], lines: list[str]) -> bool:
    if not isinstance(statement, ast.Import | ast.ImportFrom) or _bound(statement) & reads:
        return False
    if isinstance(statement, ast.ImportFrom) and statement.module == "__future__":
        return False  # it changes how the rest compiles
    if any(alias.name == "*" for alias in statement.names):
        return False  # what it binds is not known here
    # One written with others on one line stays: an unused import costs little.
    return not _shares_a_line(statement, *_span(statement), lines)


class CallPickler(pickle.Pickler):
    """Plain pickle, in which a function or class of the running script is its name in `__main__`
    (defined again there on the node from its source), a module is its import, and what has no name of
    its own (a lambda, a nested function or class) raises `NoSource`. It records the names of `__main__`
    it wrote and the modules the node imports to read it."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=4)
        self.main_names: set[str] = set()
        self.modules: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.ModuleType):
            self.modules.add(obj.__name__.split(".")[0])
            return importlib.import_module, (obj.__name__,)
        if not isinstance(obj, type | types.FunctionType | types.BuiltinFunctionType):
            return NotImplemented
        if "<" in obj.__qualname__:
            raise NoSource(obj)
        module = getattr(obj, "__module__", None) or "builtins"
        if module == "__main__":
            self.main_names.add(obj.__qualname__.split(".")[0])
        else:
            self.modules.add(module.split(".")[0])
        return NotImplemented


@dataclass(frozen=True)
class Pickled:
    data: bytes
    main_names: frozenset[str]  # the names of `__main__` it refers to
    modules: frozenset[str]  # the top-level modules it imports


def dumps(obj: Any) -> Pickled:
    """``obj`` pickled by `CallPickler`."""
    written = io.BytesIO()
    pickler = CallPickler(written)
    pickler.dump(obj)
    return Pickled(written.getvalue(), frozenset(pickler.main_names), frozenset(pickler.modules))
