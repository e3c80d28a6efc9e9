# The Apptainer helper: real Apptainer (from Debian sid) and squashfs-tools 4.6+ (for `mksquashfs -tar`)
# on the pinned Debian base, so hosts without Apptainer can still make SIFs. Built offline from Debian's
# mirror only; no registry. Every package it adds is pinned in lock/apt-helper.txt (`hpcbox lock`
# refreshes it): a SIF's bytes depend on the mksquashfs and Apptainer that write it.
ARG BASE=hpcbox/debian:trixie
FROM ${BASE}
COPY add-sid.sh apt-helper.txt /tmp/helper/
RUN --mount=type=secret,id=apt_mirror sh /tmp/helper/add-sid.sh \
 && grep -v '^#' /tmp/helper/apt-helper.txt \
    | xargs env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/helper /var/log/*.log /var/log/apt \
    /tmp/hpcbox-apt /etc/apt/apt.conf.d/00hpcbox-mirror \
 && apptainer --version && mksquashfs -version | head -n1
LABEL org.opencontainers.image.title="hpcbox apptainer helper"
