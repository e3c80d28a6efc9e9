"""Log paths: Slurm's filename patterns, checked where a user gives them and expanded for the ledger."""

from __future__ import annotations

import pytest

from hpcbox.render import logpaths, profiles
from hpcbox.render.resources import FieldError, ResourceRequest, resolve
from hpcbox.render.sbatch import JobInputs, render_sbatch


@pytest.mark.parametrize(
    ("pattern", "array"),
    [
        ("logs/%x-%j.out", False),
        ("job.out", False),
        ("%x/%j.out", False),
        ("/scratch/me/%x/100%%/%x-%5j.out", False),
        ("logs/%x-%A_%4a.out", True),
        ("logs/%u-%j.log", False),
        ("/home/%u/slogs/sl_%A.out", False),  # the Edinburgh cluster-scripts' own header
        ("/scratch/%u/logs/slurm-%j-%x.out", False),  # the Calcul Quebec course script's
    ],
)
def test_patterns_sbatch_expands_and_hpcbox_can_prepare_are_accepted(pattern: str, array: bool):
    assert logpaths.check("log", pattern, array=array) == pattern


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("logs/%j/out.txt", "'logs/%j/out.txt': %j in the folder is only known once the job runs, and Slurm "
                            "writes no log into a missing folder (allowed in folders: %x %u %%; put %j in "
                            "the file name)"),
        ("%j/x.out", "'%j/x.out': %j in the folder is only known once the job runs"),
        ("logs/%N.out", "'logs/%N.out': '%N' is not a pattern hpcbox knows (allowed: %j %x %u %A %a %%)"),
        ("logs/x%", "'logs/x%': '%' is not a pattern hpcbox knows"),
        ("logs/%a.out", "'logs/%a.out': %a is an array task's id, and this job is no array"),
        ("logs/", "'logs/' is a folder; name the file too, e.g. logs/%x-%j.out"),
        ("~/logs/x.out", "'~/logs/x.out' starts with ~, which Slurm does not expand"),
        ("logs\\%j.out", "contains a backslash, which turns Slurm's patterns off"),
        ("logs/*.out", "contains *, ? or ["),
        ("logs/a\nb.out", "is empty or contains control characters"),
    ],
)  # fmt: skip
def test_patterns_hpcbox_cannot_honour_are_refused_in_one_line(pattern: str, problem: str):
    with pytest.raises(FieldError) as refused:
        logpaths.check("error_log", pattern, array=False)
    assert refused.value.field == "error_log"
    assert refused.value.message.startswith(f"error_log: {pattern!r}")
    assert problem in refused.value.message
    assert "\n" not in refused.value.message


def test_expansion_is_what_sbatch_writes_with_the_array_task_left_to_a_glob():
    expand = logpaths.expand
    assert expand("logs/%x-%j.out", job_id="42", job_name="fit", user="me") == "logs/fit-42.out"
    assert expand("/s/%u/%%x-%6j", job_id="42", job_name="fit", user="me") == "/s/me/%x-000042"
    assert expand("logs/%x-%A_%3a.out", job_id="42", job_name="fit", user="me") == "logs/fit-42_*.out"
    assert logpaths.folder("out/%x/100%%/%j.log", "fit", "me") == "out/fit/100%"
    assert logpaths.folder("/home/%u/slogs/sl_%A.out", "fit", "s123") == "/home/s123/slogs"
    assert logpaths.folder("%j.log", "fit", "me") is None


def _script(**given):
    profile = profiles.load_profile("local")
    checked = resolve(profile, ResourceRequest(job_name="fit", **given))
    return render_sbatch(profile, checked, JobInputs.defaults("trainer"))


def test_separate_logs_are_rendered_and_their_folders_made_before_sbatch():
    script = _script(log="out/%x/%j.out", error_log="/scratch/err/%x-%j.err")
    assert "#SBATCH --output=out/%x/%j.out\n#SBATCH --error=/scratch/err/%x-%j.err\n" in script.text
    assert script.directories_to_create("me") == ("out/fit", "/scratch/err", "runs")
    assert "#   mkdir -p out/fit /scratch/err && sbatch <this file>" in script.text


def test_one_file_for_both_streams_writes_no_error_line():
    script = _script(log="logs/%x-%j.log", error_log="logs/%x-%j.log")
    assert "#SBATCH --output=logs/%x-%j.log\n" in script.text
    assert "--error" not in script.text
    assert script.directories_to_create("me") == ("logs", "runs")


def test_a_log_in_the_submit_directory_needs_no_folder():
    script = _script(log="%x-%j.out")
    assert script.directories_to_create("me") == ("runs",)
    assert "\n#   sbatch <this file>\n" in script.text


def test_a_users_own_folder_is_made_for_the_login_user_and_the_script_says_how_by_hand():
    script = _script(log="/home/%u/slogs/sl_%j.out")
    assert "#SBATCH --output=/home/%u/slogs/sl_%j.out\n" in script.text
    assert script.directories_to_create("s123") == ("/home/s123/slogs", "runs")
    assert '#   mkdir -p /home/"$USER"/slogs && sbatch <this file>' in script.text
    odd = _script(log="/scratch/my logs/%u/%x.out")
    assert "#   mkdir -p '/scratch/my logs/'\"$USER\" && sbatch <this file>" in odd.text


def test_the_default_log_is_under_the_log_folder():
    script = _script()
    assert "#SBATCH --output=logs/fit-%j.out\n" in script.text
    assert script.log_patterns == ("logs/fit-%j.out", None)
    assert script.directories_to_create("me") == ("logs", "runs")


def test_a_bad_log_given_as_a_resource_names_its_field():
    with pytest.raises(FieldError) as refused:
        _script(log="logs/%j/x.out")
    assert refused.value.field == "log"
