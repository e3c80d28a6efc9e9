"""Reading apt's simulated installs: how `invoke lock` pins the Apptainer helper's packages."""

from __future__ import annotations

from hpcbox.build.lock import simulated_installs

SIMULATED = """\
NOTE: This is only a simulation!
Reading package lists...
The following NEW packages will be installed:
  apptainer squashfs-tools
Inst libsquashfuse0 (0.5.2-0.2+b2 Debian:13.2/stable [amd64])
Inst squashfs-tools (1:4.7.5-1 Debian:unstable [amd64])
Inst libc6 [2.41-12] (2.41-13 Debian:unstable [amd64])
Inst apptainer (1.4.5-2 Debian:unstable [amd64])
Conf libsquashfuse0 (0.5.2-0.2+b2 Debian:13.2/stable [amd64])
"""


def test_every_installed_package_with_its_exact_version_upgrades_included():
    assert simulated_installs(SIMULATED) == {
        "libsquashfuse0": "0.5.2-0.2+b2",
        "squashfs-tools": "1:4.7.5-1",
        "libc6": "2.41-13",
        "apptainer": "1.4.5-2",
    }
