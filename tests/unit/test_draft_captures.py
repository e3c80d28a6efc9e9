"""`hpcbox profile.draft` on what real clusters printed: published captures of `scontrol show partition
--oneliner` and of sinfo's gres column (tests/unit/data/draft/captures/, each naming its site and its
source), each given to the draft as the login node's answers and compared whole with a committed
expected draft (tests/golden/draft/). Nothing comes from a shipped profile and nothing is deleted before
comparing: the expected files are what the draft made of each site's own output, read and checked by
hand. After a change to the draft, rewrite them with HPCBOX_UPDATE_GOLDEN=1 and review the diff.

A capture holds what its source printed, no more, and the draft is given nothing else but
`sinfo --version`, which no capture holds and without which the draft refuses (00.00 stands in): every
other probe is not run, as one that did not answer, and `sbatch --test-only` told nothing
(Rules(None, None, None))."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpcbox.errors import HpcboxError
from hpcbox.render import profiles
from hpcbox.survey import draft
from hpcbox.survey.doctor import NOT_RUN, Probed
from hpcbox.tools import ssh

CAPTURES = Path(__file__).resolve().parent / "data" / "draft" / "captures"
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "draft"
UPDATE = os.environ.get("HPCBOX_UPDATE_GOLDEN") == "1"
NO_VERSION = Probed("slurm 00.00", 0)  # `sinfo --version` as the draft reads it; no capture has it
NOT_TOLD = draft.Rules(None, None, None)  # no capture has sbatch --test-only's answers


def captured(name: str) -> str:
    """A capture's text as its site printed it: the file less its header (the lines starting with '#')."""
    lines = (CAPTURES / name).read_text().splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("#"))


def matches_golden(name: str, text: str) -> None:
    golden = GOLDEN / name
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.is_file(), f"no golden file {golden}: write it with HPCBOX_UPDATE_GOLDEN=1 and review it"
    assert text == golden.read_text()


def puhti_gres() -> str:
    """CSC printed `%R|%l|%m|%z|%G`, a line for each kind of node in a partition; the draft's probe
    prints `%R|%N|%G`, a line for each node, and reads the partition and the gres of a line alone. Each
    captured line is given as its partition and its gres, the node's name left empty."""
    lines = (line.split("|") for line in captured("puhti.sinfo").splitlines())
    return "".join(f"{fields[0]}||{fields[4]}\n" for fields in lines)


@dataclass(frozen=True)
class Capture:
    host: str  # the login node a user of the site names (--host)
    answers: dict[str, Probed]  # the probes the capture answers, as the draft's probe script gets them


SCONTROL_CAPTURES = {
    # Puhti (CSC, Finland): all 9 partitions, with sinfo's gres of each kind of node.
    "puhti": Capture(
        "puhti.csc.fi",
        {"partitions": Probed(captured("puhti.scontrol"), 0), "gres": Probed(puhti_gres(), 0)},
    ),
    # Grex (University of Manitoba): all 13 partitions; no sinfo, so no gres.
    "grex": Capture("grex.hpc.umanitoba.ca", {"partitions": Probed(captured("grex.scontrol"), 0)}),
}


def drafted(name: str, named: tuple[str, ...] = ()) -> draft.Draft:
    """The draft of a capture, made as `profile.draft` makes it (read_site, choose, compose): the
    partitions ``named`` (--partitions), else those it chooses."""
    capture = SCONTROL_CAPTURES[name]
    target = ssh.Target(capture.host)
    site = draft.read_site({"slurm": NO_VERSION, **capture.answers}, target.address)
    chosen, left_out = draft.choose(site, named)
    return draft.compose(target, site, chosen, left_out, NOT_TOLD, None, today="a published capture")


@pytest.mark.parametrize("name", sorted(SCONTROL_CAPTURES))
def test_a_sites_own_output_drafts_to_its_expected_profile(name: str):
    made = drafted(name)
    # What profile.draft checks before it writes: the text is a profile hpcbox loads.
    profiles.parse_profile(tomllib.loads(made.text), name=name)
    matches_golden(f"{name}.toml", made.text)


# Grex's partitions that its access lists keep out of the draft unless named: one for some accounts
# alone with GPUs on its one node (livi), one with GPUs on two (agro), one without TRES GPUs (chrim).
GREX_NAMED = ("chrim", "agro", "livi")


def test_partitions_named_are_drafted_with_their_access_lists():
    made = drafted("grex", GREX_NAMED)
    profiles.parse_profile(tomllib.loads(made.text), name="grex")
    assert (made.partitions, made.left_out, made.closed) == (GREX_NAMED, (), ())
    matches_golden("grex-named.toml", made.text)


def test_partitions_open_to_some_accounts_alone_are_left_out_and_said():
    made = drafted("grex")
    assert made.closed == ("chrim", "chrimlm", "mcordcpu", "agro", "livi")
    assert not set(made.closed) & set(made.partitions) and made.left_out == ()
    # Each with its list, as scontrol printed it, in the file's comment.
    assert "#   agro: AllowAccounts=def-nasem,def-mccartca,def-cordeiro,def-jfrank,def-gshamov," in made.text


def seen(name: str) -> dict[str, tuple]:
    """Each partition as the draft reads it: default, max_time, nodes, qos, gpu_types, gpus_per_node."""
    answers = SCONTROL_CAPTURES[name].answers
    gres = answers.get("gres", NOT_RUN)
    found = draft.parse_partitions(answers["partitions"].output, gres.output if gres.answered else None)
    return {p.name: (p.default, p.max_time, p.nodes, p.qos, p.gpu_types, p.gpus_per_node) for p in found}


def partitions(name: str) -> dict[str, draft.SeenPartition]:
    answers = SCONTROL_CAPTURES[name].answers
    return {p.name: p for p in draft.parse_partitions(answers["partitions"].output, None)}


def test_what_the_draft_reads_of_puhtis_partitions():
    assert seen("puhti") == {
        "small": (True, "3-00:00:00", 654, None, (), 0),
        "large": (False, "3-00:00:00", 654, None, (), 0),
        "test": (False, "00:15:00", 6, None, (), 0),
        "longrun": (False, "14-00:00:00", 654, None, (), 0),
        "hugemem": (False, "3-00:00:00", 18, None, (), 0),
        "hugemem_longrun": (False, "7-00:00:00", 18, None, (), 0),
        "gputest": (False, "00:15:00", 2, None, ("v100",), 4),
        "gpu": (False, "3-00:00:00", 78, None, ("v100",), 4),
        "interactive": (False, "7-00:00:00", 4, None, (), 0),
    }


def test_what_the_draft_reads_of_grexs_partitions():
    found = seen("grex")
    # AllowQos=normal,high (and normal,cpupreempt, normal,gpupreempt) names no one QOS; AllowQos=normal does.
    assert {name for name, facts in found.items() if facts[3]} == {"mcordcpu", "agro", "livi"}
    assert found["skylake"][:4] == (True, "21-00:00:00", 43, None)
    assert found["genoacpu-b"][:4] == (False, "7-00:00:00", 10, None)
    assert found["lgpu"][:4] == (False, "3-00:00:00", 1, None)
    # No sinfo in the capture, so no node's gres: GPU types are not seen anywhere, nor GPU counts but
    # where scontrol's TRES gives them for one node: lgpu's gres/gpu=2, livi's gres/gpu=16. agro, agro-b
    # (gres/gpu=4 on 2 nodes) and gpu (8 on 2) have GPUs, how many on each node not seen.
    assert {name: facts[4:] for name, facts in found.items() if facts[4:] != (None, None)} == {
        "lgpu": (None, 2),
        "livi": (None, 16),
    }
    tres = {name: p.gpus_in_tres for name, p in partitions("grex").items() if p.gpus_in_tres}
    assert tres == {"agro": 4, "agro-b": 4, "gpu": 8, "lgpu": 2, "livi": 16}


def test_grexs_access_lists_as_scontrol_printed_them():
    found = partitions("grex")
    assert [str(a) for a in found["chrim"].access] == [
        "AllowAccounts=def-rleduc42,def-zovoilis-ab",
        "AllowQos=normal,high",
    ]
    assert [str(a) for a in found["skylake"].access] == ["AllowQos=normal,high"]
    # AllowAccounts names some accounts alone on these: the draft leaves them out unless named.
    site = draft.read_site({"slurm": NO_VERSION, **SCONTROL_CAPTURES["grex"].answers}, "grex")
    assert {p.name for p in site.partitions if draft.closed(p, site)} == {
        "chrim",
        "chrimlm",
        "mcordcpu",
        "agro",
        "livi",
    }


def test_grexs_preemptible_partitions_are_those_a_higher_priority_tier_shares_nodes_with():
    found = partitions("grex")
    # PreemptMode=CANCEL on two: genoacpu-b's nodes n[388-392,423-427] are also mcordcpu's n[388-392]
    # (PriorityTier 9 to its 2), chrim's n[424-427] and chrimlm's n423; agro-b's g[384-385] are agro's
    # (10 to 1). Every other partition is PreemptMode=OFF.
    assert {name: p.outranked_by for name, p in found.items() if p.preemptible} == {
        "genoacpu-b": ("chrim", "chrimlm", "mcordcpu"),
        "agro-b": ("agro",),
    }
    assert (found["genoacpu-b"].preempt_mode, found["genoacpu-b"].grace_time_s) == ("CANCEL", 100)
    # skylake's nodes n[339-381] are no other partition's: outranked by none, and OFF anyway.
    assert found["skylake"].outranked_by == () and found["skylake"].preempt_mode == "OFF"


def test_puhtis_partitions_preempt_nothing():
    assert not any(p.preemptible or p.outranked_by for p in partitions("puhti").values())


# Captures of sinfo's gres column (%G) alone, by file: how to find the column in a line.
GRES_CAPTURES = {
    "mila.gres": lambda line: line.split("|")[1],
    "narval.gres": lambda line: line.split("|")[1],
    "rorqual.gres": lambda line: line.split("|")[1],
    "tamia.gres": lambda line: line.split("|")[1],
    # nodeinfo's columns: partition, time limit, CPU model, CPUs, memory, GPU model (%G), state, nodes, list.
    "carc.nodeinfo": lambda line: line.split()[5],
}


def gres_column(name: str) -> list[str]:
    rows = [line for line in captured(name).splitlines() if line.strip()]
    if name.endswith(".nodeinfo"):  # less the table's header and rules
        rows = [line for line in rows if len(line.split()) == 9 and not line.startswith(("-", "Partition"))]
    return list(dict.fromkeys(GRES_CAPTURES[name](line) for line in rows))


def read_as_the_draft_does(gres: tuple[str, ...]) -> str:
    partition = draft.SeenPartition("p", False, None, len(gres), "UP", (), gres)
    said = f"gpu_types = {list(partition.gpu_types or ())}, gpus_per_node = {partition.gpus_per_node}"
    return said + (
        f", MIG slices counted as GPUs: {list(partition.mig_types)}" if partition.mig_types else ""
    )


@pytest.mark.parametrize("name", sorted(GRES_CAPTURES))
def test_a_sites_gres_reads_as_expected(name: str):
    """Each kind of node's gres as the draft reads a node's (its GPU types, the GPUs on it), then all of
    them together, as the draft would read a partition holding one node of each kind."""
    column = gres_column(name)
    lines = [f"{gres}: {read_as_the_draft_does((gres,))}" for gres in column]
    lines.append(f"all together: {read_as_the_draft_does(tuple(column))}")
    matches_golden(f"{name}.txt", "\n".join(lines) + "\n")


def test_grexs_partitions_open_to_the_users_accounts_are_drafted():
    """With sacctmgr's answer (made up: a member of def-gshamov, QOS normal), the partitions whose
    AllowAccounts names that account are the user's; those naming none of the user's stay out."""
    answers = {**SCONTROL_CAPTURES["grex"].answers, "associations": Probed("def-gshamov|normal", 0)}
    site = draft.read_site({"slurm": NO_VERSION, **answers}, "grex")
    chosen, left_out = draft.choose(site, ())
    assert {"mcordcpu", "agro", "livi"} <= {p.name for p in chosen}
    assert {p.name: draft.closed(p, site) for p in left_out} == {
        "chrim": ("AllowAccounts=def-rleduc42,def-zovoilis-ab, none of yours (def-gshamov)",),
        "chrimlm": ("AllowAccounts=def-rleduc42,def-zovoilis-ab, none of yours (def-gshamov)",),
    }
    # A QOS the partitions do not allow closes them all: Grex's lists name normal, high and *preempt.
    alone = {**answers, "associations": Probed("def-gshamov|debug", 0)}
    with pytest.raises(
        HpcboxError, match=r"^no partition here is open to you \(skylake: AllowQos=normal,high, none"
    ):
        draft.choose(draft.read_site({"slurm": NO_VERSION, **alone}, "grex"), ())


def test_a_partition_of_narvals_mig_nodes_says_its_gpus_are_slices():
    """Narval's MIG node gives 15 "GPUs": the slices, which the draft counts as Slurm does, and says so."""
    gres = tuple(gres_column("narval.gres"))
    partition = draft.SeenPartition("a100mig", False, None, len(gres), "UP", (), gres)
    site = draft.Site("00.00", (partition,), (), None, (), None, "", None, False)
    made = draft.compose(ssh.Target("narval"), site, (partition,), (), NOT_TOLD, None, today="d")
    drafted = tomllib.loads(made.text)["partitions"][0]
    assert drafted["gpus_per_node"] == 15
    assert drafted["notes"].endswith(
        "; MIG slices, each counted as a GPU: a100_3g.20gb, a100_4g.20gb, a100_2g.10gb, a100_1g.5gb"
    )
