"""A figure in the docs is read from a results file, never typed: every figure block, on every page of the
docs site and in the README, is what its file gives (a benchmark's bench/results/NAME.json, or the
recorded digests in digests.toml)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _runner():
    spec = importlib.util.spec_from_file_location("bench_run", REPO / "bench" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_documents_kept_in_step_are_the_readme_and_every_page_of_the_docs():
    runner = _runner()
    assert set(runner.DOCUMENTS) == {REPO / "README.md", *(REPO / "docs").rglob("*.md")}


def test_every_figure_block_in_the_docs_is_its_file_as_bench_run_writes_it():
    runner = _runner()
    for document in runner.DOCUMENTS:
        text = document.read_text()
        assert runner.docs_blocks(text) == text, (
            f"{document.relative_to(REPO)}: a figure block differs from its file: "
            "run `python bench/run.py --docs-only` (or `invoke bench --name NAME` to measure again)"
        )


def test_every_results_file_and_the_recorded_digests_are_shown_somewhere_in_the_docs():
    runner = _runner()
    shown = {
        name
        for document in runner.DOCUMENTS
        for name in re.findall(r"<!-- bench:(\w+) -->", document.read_text())
    }
    files = {path.stem for path in (REPO / "bench" / "results").glob("*.json")}
    assert files | {"digests"} <= shown, f"not in any page: {sorted(files | {'digests'} - shown)}"


def test_a_typed_figure_in_a_block_is_put_back_as_the_results_file_says():
    runner = _runner()
    written = runner.docs_blocks(
        "before\n<!-- bench:offlock -->\n| typed | 1 |\n<!-- /bench:offlock -->\nafter\n"
    )
    assert "| typed | 1 |" not in written
    assert written.startswith("before\n<!-- bench:offlock -->\n\n`bench/results/offlock.json`: measured ")
    assert written.endswith("|\n\n<!-- /bench:offlock -->\nafter\n")


def test_the_digests_block_shows_every_recorded_value_from_the_file_it_is_given(tmp_path: Path):
    runner = _runner()
    digests = tmp_path / "digests.toml"
    digests.write_text(
        'revision = "1a2b3c"\nflavour = "cpu"\ncompression = "zstd:3"\nbase_id = "sha256:ba5e"\n'
        'content_hash = "c0ffee"\nrootfs_sha256 = "f00d"\nsif_sha256 = "5af3"\nsif_size = 514129920\n'
        'converter = "apptainer version 9"\nrecorded = "2030-01-02"\nsomething_new = "n3w"\n'
    )
    written = runner.docs_blocks("<!-- bench:digests -->\n<!-- /bench:digests -->\n", digests=digests)
    assert "recorded 2030-01-02" in written and "| SIF size (bytes) | 514,129,920 |" in written
    for value in ("1a2b3c", "sha256:ba5e", "c0ffee", "f00d", "5af3", "apptainer version 9", "n3w"):
        assert f"`{value}`" in written
    # The SIF's hash comes after the root filesystem's, a key the docs do not know yet last.
    assert written.index("f00d") < written.index("5af3") < written.index("n3w")


def test_the_readmes_links_into_the_docs_lead_to_pages_that_exist():
    # The site's own links are checked by `mkdocs build --strict`; the README is not one of its pages.
    readme = (REPO / "README.md").read_text()
    targets = re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)]*)?\)", readme)
    assert targets, "the README links to no page of the docs"
    missing = [target for target in targets if not (REPO / target).is_file()]
    assert not missing, f"README.md links to pages that do not exist: {missing}"
