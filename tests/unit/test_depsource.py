"""A project's own dependency list read as pip requirements: which file, its translation, its refusals,
and Debian's packages of the cpu flavour as PyPI versions."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from hpcbox.errors import FieldError, HpcboxError
from hpcbox.project import depsource
from hpcbox.project.config import load_project
from hpcbox.project.depsource import DependencySource

ENVIRONMENT = """\
name: research
channels: [pytorch, nvidia, conda-forge]
dependencies:
  - python=3.11
  - pip
  - pytorch=2.5
  - pytorch-cuda=12.1
  - cudatoolkit=11.8
  - cuda-nvcc
  - conda-forge::numpy>=1.26, <2.3
  - scipy 1.14.1 py311h_0
  - pandas=2.2=py311_0
  - opencv
  - pytorch-lightning
  - tensorboard
  - pip:
    - requests==2.32.3
    - wandb
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def source(path: Path, kind: depsource.Kind, extras: tuple[str, ...] = ()) -> DependencySource:
    return DependencySource(path, kind, extras)


def message(call: Callable[[], object], error: type[HpcboxError] = HpcboxError) -> str:
    """The one-line message `call` fails with (its hint aside)."""
    with pytest.raises(error) as raised:
        call()
    assert "\n" not in raised.value.message
    return raised.value.message


def refusal(source: DependencySource) -> str:
    return message(lambda: depsource.requirements_text(source))


# --- which file --------------------------------------------------------------------------------------


def test_requirements_txt_comes_first_then_pyproject_dependencies_then_a_conda_environment(tmp_path: Path):
    write(tmp_path / "environment.yaml", ENVIRONMENT)
    assert depsource.detect(tmp_path) == source(tmp_path / "environment.yaml", "conda")
    write(tmp_path / "environment.yml", ENVIRONMENT)
    assert depsource.detect(tmp_path) == source(tmp_path / "environment.yml", "conda")
    write(tmp_path / "pyproject.toml", '[project]\nname = "mine"\ndependencies = ["requests"]\n')
    assert depsource.detect(tmp_path) == source(tmp_path / "pyproject.toml", "pyproject")
    write(tmp_path / "requirements.txt", "requests\n")
    found = depsource.detect(tmp_path)
    assert found == source(tmp_path / "requirements.txt", "requirements")
    assert found.describe() == "requirements.txt (pip requirements)"


def test_a_pyproject_without_dependencies_is_passed_over(tmp_path: Path):
    write(tmp_path / "pyproject.toml", '[project]\nname = "mine"\ndependencies = []\n')
    assert depsource.detect(tmp_path) is None
    write(tmp_path / "environment.yml", ENVIRONMENT)
    assert depsource.detect(tmp_path).kind == "conda"


def test_the_setting_names_the_file_and_its_kind(tmp_path: Path):
    write(tmp_path / "deps" / "train.txt", "requests\n")
    write(tmp_path / "env" / "gpu.yaml", ENVIRONMENT)
    assert depsource.from_setting(tmp_path, "deps/train.txt").kind == "requirements"
    assert depsource.from_setting(tmp_path, "env/gpu.yaml").kind == "conda"


@pytest.mark.parametrize(
    ("files", "setting", "extras", "expected"),
    [
        ({}, "requirements.txt", (), r"^tool\.hpcbox\.dependencies: requirements\.txt does not exist in "),
        (
            {"Pipfile": "[packages]\n"},
            "Pipfile",
            (),
            r"^tool\.hpcbox\.dependencies: Pipfile is not a dependency list hpcbox reads$",
        ),
        (
            {"requirements.txt": "requests\n"},
            "requirements.txt",
            ("gpu",),
            r"^tool\.hpcbox\.extras: only a pyproject\.toml has extras, not requirements\.txt$",
        ),
        (
            {"pyproject.toml": '[project]\ndependencies = ["a"]\n[project.optional-dependencies]\nb = []\n'},
            "pyproject.toml",
            ("gpu",),
            r"^tool\.hpcbox\.extras: pyproject\.toml has no optional-dependencies group 'gpu'$",
        ),
    ],
)
def test_a_wrong_setting_is_one_line_naming_the_field(tmp_path: Path, files, setting, extras, expected):
    for name, text in files.items():
        write(tmp_path / name, text)
    assert re.search(expected, message(lambda: depsource.from_setting(tmp_path, setting, extras), FieldError))


def test_the_project_config_reads_and_checks_the_setting(tmp_path: Path):
    (tmp_path / "src").mkdir()
    write(tmp_path / "requirements.txt", "requests\n")
    pyproject = '[tool.hpcbox]\nproject = "mine"\ncode = ["src"]\ndependencies = "{}"\n'
    write(tmp_path / "pyproject.toml", pyproject.format("requirements.txt"))
    assert load_project(tmp_path).dependencies == "requirements.txt"
    write(tmp_path / "pyproject.toml", pyproject.format("missing.txt"))
    assert message(lambda: load_project(tmp_path), FieldError).startswith(
        "tool.hpcbox.dependencies: missing.txt does not exist"
    )
    write(tmp_path / "pyproject.toml", pyproject.format("requirements.txt") + 'extras = ["gpu"]\n')
    assert message(lambda: load_project(tmp_path), FieldError) == (
        "tool.hpcbox.extras: only a pyproject.toml has extras, not requirements.txt"
    )


def test_without_the_setting_the_project_locks_docker_requirements_as_before(tmp_path: Path):
    (tmp_path / "src").mkdir()
    write(
        tmp_path / "pyproject.toml",
        '[project]\nname = "mine"\ndependencies = ["a"]\n[tool.hpcbox]\ncode = ["src"]\n',
    )
    project = load_project(tmp_path)
    assert (project.dependencies, project.extras) == ("", ())


# --- requirements.txt --------------------------------------------------------------------------------


def test_a_requirements_file_is_handed_to_uv_as_it_is(tmp_path: Path):
    text = (
        "--index-url https://pypi.org/simple\n-r base.txt\n"
        "requests==2.32.3  # pinned\ntorch; sys_platform == 'linux'\n"
    )
    write(tmp_path / "base.txt", "numpy>=2\n")
    requirements = source(write(tmp_path / "requirements.txt", text), "requirements")
    assert depsource.requirements_text(requirements) == text
    assert [str(r) for r in depsource.direct_requirements(requirements)] == [
        "numpy>=2",
        "requests==2.32.3",
        'torch; sys_platform == "linux"',
    ]


def test_requirements_for_another_platform_are_not_the_images(tmp_path: Path):
    text = "torch==2.9.1+cpu; sys_platform == 'darwin'\nnumpy --hash=sha256:abc \\\n    --hash=sha256:def\n"
    requirements = source(write(tmp_path / "requirements.txt", text), "requirements")
    assert [str(r) for r in depsource.direct_requirements(requirements)] == ["numpy"]


@pytest.mark.parametrize(
    ("line", "where"),
    [
        ("-e .", "requirements.txt:2"),
        ("--editable=git+https://github.com/me/pkg#egg=pkg", "requirements.txt:2"),
        ("./vendor/pkg", "requirements.txt:2"),
        ("/opt/wheels/pkg-1.0-py3-none-any.whl", "requirements.txt:2"),
        ("file:///opt/pkg", "requirements.txt:2"),
        ("pkg @ file:///opt/pkg", "requirements.txt:2"),
        ("src/pkg", "requirements.txt:2"),
        ("pkg-1.0-py3-none-any.whl", "requirements.txt:2"),
    ],
)
def test_editable_and_local_lines_are_refused_naming_the_line(tmp_path: Path, line: str, where: str):
    requirements = source(write(tmp_path / "requirements.txt", f"requests\n{line}\n"), "requirements")
    assert refusal(requirements) == f"{where}: {line!r} installs from a local path or in editable mode"


def test_a_local_line_in_an_included_file_names_that_file(tmp_path: Path):
    write(tmp_path / "extra" / "dev.txt", "# dev tools\n\n-e ../tools\n")
    requirements = source(
        write(tmp_path / "requirements.txt", "requests\n-r extra/dev.txt\n"), "requirements"
    )
    assert (
        refusal(requirements)
        == "extra/dev.txt:3: '-e ../tools' installs from a local path or in editable mode"
    )


def test_index_packages_by_url_and_options_pass(tmp_path: Path):
    text = "pkg @ https://example.org/pkg-1.0.tar.gz\ngit+https://github.com/me/pkg\n--find-links https://x.org/\n"
    requirements = source(write(tmp_path / "requirements.txt", text), "requirements")
    assert depsource.requirements_text(requirements) == text
    assert [r.name for r in depsource.direct_requirements(requirements)] == ["pkg"]


def test_a_missing_include_names_the_line(tmp_path: Path):
    requirements = source(write(tmp_path / "requirements.txt", "-r nowhere.txt\n"), "requirements")
    assert refusal(requirements) == "requirements.txt:1: nowhere.txt does not exist"


def test_files_that_include_each_other_are_read_once(tmp_path: Path):
    write(tmp_path / "a.txt", "-r requirements.txt\nnumpy\n")
    requirements = source(write(tmp_path / "requirements.txt", "-r a.txt\nrequests\n"), "requirements")
    assert [r.name for r in depsource.direct_requirements(requirements)] == ["numpy", "requests"]


def test_a_requirements_file_with_only_comments_is_refused(tmp_path: Path):
    requirements = source(write(tmp_path / "requirements.txt", "# nothing yet\n\n"), "requirements")
    assert refusal(requirements) == "requirements.txt: lists no packages for pip to install"


# --- pyproject.toml ----------------------------------------------------------------------------------

PYPROJECT = """\
[project]
name = "My_Project"
dependencies = ["torch>=2.4", "numpy"]
[project.optional-dependencies]
viz = ["matplotlib>=3.8"]
train = ["lightning", "my-project[viz]"]
all = ["my-project[train,viz]"]
"""


def test_pyproject_dependencies_and_named_groups(tmp_path: Path):
    pyproject = write(tmp_path / "pyproject.toml", PYPROJECT)
    assert depsource.requirements_text(source(pyproject, "pyproject")) == "torch>=2.4\nnumpy\n"
    assert depsource.requirements_text(source(pyproject, "pyproject", ("viz",))) == (
        "torch>=2.4\nnumpy\nmatplotlib>=3.8\n"
    )


def test_a_group_naming_the_project_itself_brings_those_groups_once(tmp_path: Path):
    pyproject = write(tmp_path / "pyproject.toml", PYPROJECT)
    assert depsource.requirements_text(source(pyproject, "pyproject", ("all", "viz"))) == (
        "torch>=2.4\nnumpy\nmatplotlib>=3.8\nlightning\n"
    )


def test_an_empty_pyproject_list_is_refused(tmp_path: Path):
    pyproject = write(tmp_path / "pyproject.toml", '[project]\nname = "mine"\n')
    assert refusal(source(pyproject, "pyproject")) == "pyproject.toml: lists no packages for pip to install"


def test_dynamic_dependencies_are_refused(tmp_path: Path):
    pyproject = write(tmp_path / "pyproject.toml", '[project]\nname = "mine"\ndynamic = ["dependencies"]\n')
    assert refusal(source(pyproject, "pyproject")).startswith(
        "pyproject.toml: [project] dependencies are dynamic"
    )


def test_a_local_pyproject_dependency_is_refused(tmp_path: Path):
    pyproject = write(tmp_path / "pyproject.toml", '[project]\ndependencies = ["lib @ file:///src/lib"]\n')
    assert refusal(source(pyproject, "pyproject")) == (
        "pyproject.toml: [project] dependencies: 'lib @ file:///src/lib' installs from a local path or in "
        "editable mode"
    )


# --- environment.yml ---------------------------------------------------------------------------------


def test_a_conda_environment_becomes_pip_requirements(tmp_path: Path):
    environment = write(tmp_path / "environment.yml", ENVIRONMENT)
    assert depsource.requirements_text(source(environment, "conda")).splitlines() == [
        "torch==2.5.*",
        "numpy>=1.26,<2.3",
        "scipy==1.14.1",
        "pandas==2.2.*",
        "opencv-python-headless",
        "pytorch-lightning",
        "tensorboard",
        "requests==2.32.3",
        "wandb",
    ]


@pytest.mark.parametrize(
    ("spec", "requirement"),
    [
        ("numpy", "numpy"),
        ("numpy=1.26", "numpy==1.26.*"),
        ("numpy=1.26.*", "numpy==1.26.*"),
        ("numpy==1.26.4", "numpy==1.26.4"),
        ("numpy>=1.2", "numpy>=1.2"),
        ("numpy 1.8*", "numpy==1.8.*"),
        ("numpy==1.26.4 py311_0", "numpy==1.26.4"),
        ("PyTorch=2.1=py3.11_cuda12.1_cudnn8_0", "torch==2.1.*"),
        ("conda-forge/label/main::scikit-learn>=1.4", "scikit-learn>=1.4"),
        ("pyyaml", "pyyaml"),
        ("matplotlib-base=3.9", "matplotlib==3.9.*"),
        ("python>=3.10", None),
        ("pip", None),
        ("pytorch-cuda=12.1", None),
        ("cudatoolkit", None),
        ("cuda-runtime=12.4", None),
        ("cudnn", None),
    ],
)
def test_conda_specs_as_pip_requirements(spec: str, requirement: str | None):
    assert depsource.conda_requirement(spec, "environment.yml: dependencies") == requirement


@pytest.mark.parametrize("spec", ["numpy=1.26|1.27", "numpy[version='>=1.2']", "numpy >=1.2,"])
def test_a_conda_spec_pip_cannot_say_is_one_line(spec: str):
    assert message(lambda: depsource.conda_requirement(spec, "environment.yml: dependencies")) == (
        f"environment.yml: dependencies: cannot read the conda spec {spec!r} as a pip requirement"
    )


def test_the_pip_list_is_refused_for_an_editable_install(tmp_path: Path):
    environment = write(tmp_path / "environment.yml", ENVIRONMENT.replace("- wandb", "- -e ."))
    assert refusal(source(environment, "conda")) == (
        "environment.yml: pip: '-e .' installs from a local path or in editable mode"
    )


def test_an_environment_with_only_python_is_refused(tmp_path: Path):
    environment = write(tmp_path / "environment.yml", "dependencies:\n  - python=3.11\n  - pip\n")
    assert refusal(source(environment, "conda")) == "environment.yml: lists no packages for pip to install"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\n", "environment.yml: has no dependencies: list"),
        (
            "dependencies:\n  - {conda: numpy}\n",
            "environment.yml: {'conda': 'numpy'} is neither a conda package nor a pip: list",
        ),
        ("dependencies: [numpy\n", "environment.yml is not valid YAML: while parsing a flow sequence"),
    ],
)
def test_a_malformed_environment_is_one_line(tmp_path: Path, text: str, message: str):
    environment = write(tmp_path / "environment.yml", text)
    assert refusal(source(environment, "conda")) == message


def test_a_conda_package_pypi_lacks_is_named_with_its_conda_name(tmp_path: Path):
    environment = source(write(tmp_path / "environment.yml", ENVIRONMENT + "  - libjpeg-turbo=3\n"), "conda")
    error = depsource.not_found(environment, "libjpeg-turbo", "uv's words")
    assert error.message == (
        "environment.yml: conda package libjpeg-turbo is not on PyPI under that name: "
        "list its PyPI name under pip:"
    )
    assert error.details == "uv's words"
    # a name from the pip: list is PyPI's already: only misspelt
    assert (
        depsource.not_found(environment, "wandb").message
        == "environment.yml: wandb is not in the package index"
    )


def test_a_renamed_conda_package_pypi_lacks_is_named_as_conda_wrote_it(tmp_path: Path):
    environment = source(write(tmp_path / "environment.yml", "dependencies:\n  - py-opencv\n"), "conda")
    assert depsource.not_found(environment, "opencv_python_headless").message.startswith(
        "environment.yml: conda package py-opencv is not on PyPI"
    )


# --- Debian's packages for the cpu flavour -----------------------------------------------------------


@pytest.mark.parametrize(
    ("debian", "pep440"),
    [
        ("2.6.0+dfsg-7", "2.6.0"),
        ("1:2.2.4+ds-1", "2.2.4"),
        ("0.21.0-3", "0.21.0"),
        ("1.4.2+dfsg-8", "1.4.2"),
        ("2.0.0~rc1-1", "2.0.0rc1"),
        ("3.1.2-1+b1", "3.1.2"),
        ("6.0.2", "6.0.2"),
    ],
)
def test_debian_versions_as_pep440(debian: str, pep440: str):
    assert depsource.pep440_version(debian) == pep440


def test_a_debian_version_that_is_no_python_version_names_the_package():
    assert message(lambda: depsource.pep440_version("1:abc-1", "python3-odd")) == (
        "python3-odd 1:abc-1: 'abc' is not a Python package version"
    )


def test_the_apt_lock_python_packages_by_their_pypi_names(tmp_path: Path):
    lock = write(
        tmp_path / "apt-cpu.txt",
        "# cpu flavour\npython3-torch=2.6.0+dfsg-7\nlibopenblas0=0.3.29+ds-3\npython3-sklearn=1.4.2+dfsg-8\n"
        "python3-numpy=1:2.2.4+ds-1\npython3-antlr4=4.9.2-1\n",
    )
    assert [(s.package, s.name, s.version) for s in depsource.debian_stand_ins(lock)] == [
        ("python3-torch", "torch", "2.6.0"),
        ("python3-sklearn", "scikit-learn", "1.4.2"),
        ("python3-numpy", "numpy", "2.2.4"),
        ("python3-antlr4", "antlr4-python3-runtime", "4.9.2"),  # omegaconf's: an sdist alone on PyPI
    ]


def test_an_unpinned_python_package_in_the_apt_lock_names_its_line(tmp_path: Path):
    lock = write(tmp_path / "apt-cpu.txt", "# cpu\npython3-numpy\n")
    assert message(lambda: depsource.debian_stand_ins(lock)) == "apt-cpu.txt:2: python3-numpy has no version"


def test_requirements_debians_version_does_not_satisfy(tmp_path: Path):
    lock = write(tmp_path / "apt-cpu.txt", "python3-torch=2.6.0+dfsg-7\npython3-numpy=1:2.2.4+ds-1\n")
    wanted = [Requirement(text) for text in ("torch==2.9.1", "numpy>=2", "requests", "Scikit_Learn<1")]
    conflicts = depsource.debian_conflicts(wanted, depsource.debian_stand_ins(lock))
    assert {s.package: str(requirement) for s, requirement in conflicts.items()} == {
        "python3-torch": "torch==2.9.1"
    }
