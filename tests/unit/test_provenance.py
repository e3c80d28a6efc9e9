"""The revision an artifact records: the last commit of its inputs, on real git repositories made here."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcbox.build.provenance import checkout, inputs_revision
from tests.fixtures.git import git

ENVIRONMENT = ("docker", "docker/Dockerfile")


def _commit(root: Path, message: str) -> str:
    git(root, "add", "--all")
    git(root, "commit", "--quiet", "-m", message)
    return git(root, "rev-parse", "HEAD")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _project(root: Path) -> Path:
    """A project's files: docker/ (Dockerfile, a lock), code and a README."""
    _write(root / "docker" / "Dockerfile", "FROM scratch\n")
    _write(root / "docker" / "lock" / "apt-system.txt", "libc6=2.41-12\n")
    _write(root / "src" / "tiny" / "train.py", "print('tiny')\n")
    _write(root / "README.md", "# tiny\n")
    _write(root / "pyproject.toml", '[project]\nname = "tiny"\n\n[tool.hpcbox]\ncode = ["src/tiny"]\n')
    return root


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = _project(tmp_path / "repo")
    git(root, "init", "--quiet")
    return root


def test_a_commit_elsewhere_keeps_the_revision_and_one_under_docker_moves_it(repo: Path):
    first = _commit(repo, "the project")
    assert inputs_revision(repo, ENVIRONMENT) == first

    _write(repo / "README.md", "# tiny\n\nNow with a paragraph.\n")
    _write(repo / "bench" / "results.json", "{}\n")
    readme = _commit(repo, "README and bench results only")
    assert readme != first
    assert inputs_revision(repo, ENVIRONMENT) == first
    assert inputs_revision(repo, ("src/tiny",)) == first

    _write(repo / "docker" / "lock" / "apt-system.txt", "libc6=2.41-13\n")
    locked = _commit(repo, "a new lock")
    assert inputs_revision(repo, ENVIRONMENT) == locked
    assert inputs_revision(repo, ("src/tiny",)) == first  # the code's revision stays


def test_the_revision_checked_out_holds_the_inputs_as_they_are_now(repo: Path, tmp_path: Path):
    """What `hpcbox verify` relies on: the named commit's docker/ is the work tree's."""
    _commit(repo, "the project")
    _write(repo / "docker" / "Dockerfile", "FROM scratch\nLABEL x=1\n")
    _commit(repo, "another Dockerfile")
    _write(repo / "README.md", "# tiny, documented\n")
    _commit(repo, "README only")
    revision = inputs_revision(repo, ENVIRONMENT)
    checkout(repo, revision, tmp_path / "checkout")
    assert (tmp_path / "checkout" / "docker" / "Dockerfile").read_text() == "FROM scratch\nLABEL x=1\n"
    assert (tmp_path / "checkout" / "README.md").read_text() == "# tiny\n"  # an older README, no matter


def test_only_changes_to_the_inputs_make_it_dirty(repo: Path):
    first = _commit(repo, "the project")
    _write(repo / "README.md", "# tiny, edited and not committed\n")
    _write(repo / "notes.txt", "untracked, outside the inputs\n")
    assert inputs_revision(repo, ENVIRONMENT) == first

    _write(repo / "docker" / "lock" / "apt-system.txt", "libc6=2.41-13\n")
    assert inputs_revision(repo, ENVIRONMENT) == f"{first}-dirty"
    assert inputs_revision(repo, ("src/tiny",)) == first
    git(repo, "add", "docker")  # staged is still not committed
    assert inputs_revision(repo, ENVIRONMENT) == f"{first}-dirty"


def test_an_untracked_file_in_the_inputs_makes_it_dirty_and_an_ignored_one_does_not(repo: Path):
    _write(repo / ".gitignore", "*.log\n")
    first = _commit(repo, "the project")
    _write(repo / "docker" / "build.log", "ignored\n")
    assert inputs_revision(repo, ENVIRONMENT) == first
    # A new file goes into the build context, and so the image, while no commit holds it.
    _write(repo / "docker" / "extra.sh", "#!/bin/sh\n")
    assert inputs_revision(repo, ENVIRONMENT) == f"{first}-dirty"


def test_a_file_given_as_an_input_counts_on_its_own(repo: Path):
    """The Dockerfile may live outside docker/ (tool.hpcbox.dockerfile)."""
    first = _commit(repo, "the project")
    _write(repo / "Dockerfile.gpu", "FROM scratch\n")
    second = _commit(repo, "a Dockerfile at the top")
    assert inputs_revision(repo, ("docker", "Dockerfile.gpu")) == second
    assert inputs_revision(repo, ("docker",)) == first
    _write(repo / "Dockerfile.gpu", "FROM scratch\nLABEL y=2\n")
    assert inputs_revision(repo, ("docker", "Dockerfile.gpu")) == f"{second}-dirty"


def test_a_project_in_a_subfolder_of_the_repository(tmp_path: Path):
    """Paths are the project's, relative to its root, not to the repository's top."""
    top = tmp_path / "monorepo"
    project = _project(top / "projects" / "tiny")
    _write(top / "docker" / "Dockerfile", "FROM scratch\n# the repository's own, not the project's\n")
    git(top, "init", "--quiet")
    first = _commit(top, "two projects")

    _write(top / "docker" / "Dockerfile", "FROM scratch\n# changed\n")
    _write(top / "README.md", "# the monorepo\n")
    _commit(top, "the top's docker/ and README")
    assert inputs_revision(project, ENVIRONMENT) == first

    _write(project / "docker" / "Dockerfile", "FROM scratch\nLABEL z=3\n")
    assert inputs_revision(project, ENVIRONMENT) == f"{first}-dirty"
    moved = _commit(top, "the project's Dockerfile")
    assert inputs_revision(project, ENVIRONMENT) == moved
    _write(top / "docker" / "new.sh", "#!/bin/sh\n")  # untracked, but in the top's docker/
    assert inputs_revision(project, ENVIRONMENT) == moved


def test_inputs_no_commit_holds_are_uncommitted_changes_of_head(repo: Path):
    head = _commit(repo, "the project")
    _write(repo / "tools" / "Dockerfile", "FROM scratch\n")
    assert inputs_revision(repo, ("tools",)) == f"{head}-dirty"


def test_no_commit_at_all_or_no_repository_is_unknown(repo: Path, tmp_path: Path):
    assert inputs_revision(repo, ENVIRONMENT) == "unknown"  # `git init`, nothing committed
    outside = _project(tmp_path / "outside")
    assert inputs_revision(outside, ENVIRONMENT) == "unknown"


def test_an_input_outside_the_repository_is_unknown(repo: Path):
    _commit(repo, "the project")
    assert inputs_revision(repo, ("docker", "../elsewhere")) == "unknown"


def test_paths_are_read_literally_and_none_is_refused(repo: Path):
    _commit(repo, "the project")
    _write(repo / "docs" / "a.txt", "a\n")
    _commit(repo, "docs")
    _write(repo / "README.md", "# tiny, again\n")
    head = _commit(repo, "README")
    # No file is called `d*` (as a pattern it would be docs/ and docker/, last changed by "docs").
    assert inputs_revision(repo, ("d*",)) == f"{head}-dirty"
    with pytest.raises(ValueError, match="needs a path"):
        inputs_revision(repo, ())
