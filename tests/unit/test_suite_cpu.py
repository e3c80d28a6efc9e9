"""Where a full run's CPU went (bench/suite_cpu.py): the kernel's process accounting records read (each a
`struct acct_v3`, its times as comp_t), each process placed by its nearest telling ancestor, and the
rows by place and by program. The records here are packed as the kernel packs them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import conftest

cpu = conftest._bench("suite_cpu")


def _comp(ticks: int) -> int:
    """``ticks`` as a comp_t: 13-bit mantissa, base-8 exponent (rounded down, as the kernel does)."""
    exponent = 0
    while ticks > 0x1FFF:
        ticks >>= 3
        exponent += 1
    return (exponent << 13) | ticks


def _record(pid: int, ppid: int, comm: str, cpu_s: float) -> bytes:
    ticks = round(cpu_s * 100)
    return cpu._ACCT_V3.pack(
        0, 3, 0, 0, 0, 0, pid, ppid, 0, 0.0, _comp(ticks // 2), _comp(ticks - ticks // 2), 0, 0, 0, 0, 0, 0,
        comm.encode(),
    )  # fmt: skip


def _written(tmp_path: Path, *records: tuple[int, int, str, float]) -> Path:
    """Records in the order processes end: a child before its parent."""
    path = tmp_path / "pacct"
    path.write_bytes(b"".join(_record(*each) for each in records))
    return path


def test_records_read_with_their_cpu_and_each_placed_by_its_nearest_telling_ancestor(tmp_path: Path):
    path = _written(
        tmp_path,
        (300, 200, "python", 1.5),  # a trainer: python < slurm_script < slurmstepd
        (200, 100, "slurm_script", 0.01),
        (100, 50, "slurmstepd", 0.02),
        (400, 350, "apt-get", 2.0),  # a build step: apt-get < sh < containerd-shim
        (350, 340, "sh", 0.0),
        (340, 1, "containerd-shim", 0.1),
        (500, 1, "ssh", 0.25),  # here
        (300, 1, "rsync", 0.3),  # pid 300 again, later: another process, here
    )
    processes = cpu.read(path)
    assert [(p.pid, p.comm) for p in processes][:2] == [(300, "python"), (200, "slurm_script")]
    assert processes[0].cpu_s == pytest.approx(1.5) and processes[3].cpu_s == pytest.approx(2.0)
    placed = {(process.pid, process.comm): place for process, place in cpu.places(processes)}
    assert placed[(300, "python")] == "in Slurm jobs"
    assert placed[(400, "apt-get")] == placed[(350, "sh")] == "in other containers"
    assert (
        placed[(500, "ssh")]
        == placed[(300, "rsync")]
        == placed[(340, "containerd-shim")]
        == "on this machine"
    )


def test_a_long_time_is_read_through_the_exponent_of_its_comp_t():
    assert cpu._seconds(_comp(123_456)) == pytest.approx(1234.56, rel=1e-3)
    assert cpu._seconds(_comp(99)) == 0.99


def test_rows_say_the_cpu_by_place_and_by_program_with_each_programs_split(tmp_path: Path):
    path = _written(
        tmp_path,
        (300, 200, "python", 60.0),
        (200, 100, "slurm_script", 0.0),
        (100, 50, "slurmstepd", 0.0),
        (310, 1, "python", 30.0),
        (400, 340, "mksquashfs", 12.0),
        (340, 1, "containerd-shim", 0.0),
    )
    rows = {row["metric"]: row for row in cpu.rows(cpu.read(path), {"dockerd": 18.0}, wall_s=60.0, cores=2)}
    whole = rows["CPU, every process that ended during the run and the engine's daemons"]
    assert whole["value"] == 2.0 and whole["note"] == "100 % of 2 cores over the run"  # 120 s of 120
    assert rows["CPU in Slurm jobs"]["value"] == 1.0 and rows["CPU on this machine"]["value"] == 0.5
    assert rows["CPU of the engine's daemons"]["value"] == 0.3
    assert rows["CPU: python"]["note"] == "2 runs: 1.0 in Slurm jobs, 0.5 on this machine"
    assert rows["CPU: mksquashfs"]["note"] == "1 run: 0.2 in other containers"
    assert list(rows).index("CPU: python") < list(rows).index("CPU: mksquashfs")  # most first


def test_records_of_another_format_are_refused(tmp_path: Path):
    path = tmp_path / "pacct"
    path.write_bytes(_record(1, 0, "x", 0.0).replace(b"\x00\x03", b"\x00\x02", 1))
    with pytest.raises(ValueError, match="not acct v3 records"):
        cpu.read(path)
