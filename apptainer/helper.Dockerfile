# The Apptainer helper: real Apptainer (1.4, from Debian sid) and squashfs-tools 4.6+ (for `mksquashfs -tar`)
# on the bootstrapped trixie base, so hosts without Apptainer can still make SIFs. Built offline from
# Debian's mirror only; no registry. sid is pinned low so that only the packages named `/sid` come from it
# (and what they strictly need). sid keeps only its newest versions, so instead of exact pins the build
# checks the floors hpcbox relies on: Apptainer 1.4 (`sif` subcommands) and squashfs-tools 4.6 (`-tar`).
ARG BASE=hpcbox/debian:trixie
FROM ${BASE}
# sid comes from the same mirror as the base image's own suite.
RUN sed -n -E 's#^deb ([^ ]+) [a-z]+ main.*#deb \1 sid main#p' /etc/apt/sources.list > /etc/apt/sources.list.d/sid.list \
 && test -s /etc/apt/sources.list.d/sid.list \
 && printf 'Package: *\nPin: release n=sid\nPin-Priority: 100\n' > /etc/apt/preferences.d/10-sid-low \
 && apt-get -o Acquire::Check-Valid-Until=false update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      apptainer/sid squashfs-tools/sid squashfuse fuse2fs fuse-overlayfs uidmap \
 && rm -rf /var/lib/apt/lists/* \
 && dpkg --compare-versions "$(dpkg-query -W -f '${Version}' apptainer)" ge 1.4 \
 && dpkg --compare-versions "$(dpkg-query -W -f '${Version}' squashfs-tools)" ge 1:4.6 \
 && apptainer --version && mksquashfs -version | head -n1
LABEL org.opencontainers.image.title="hpcbox apptainer helper"
