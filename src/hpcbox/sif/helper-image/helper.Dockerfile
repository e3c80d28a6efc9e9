# The Apptainer helper: real Apptainer (from Debian sid) and squashfs-tools 4.6+ on the pinned Debian
# base, so hosts without Apptainer can still make SIFs. Built offline from Debian's mirror only; no
# registry. A SIF's bytes depend on the mksquashfs, libdeflate and Apptainer that write it: lock/ pins
# those at their exact versions (`hpcbox lock` refreshes both files), the rest follows the mirror.
# dpkg's per-file syncs are left out (--force-unsafe-io): a build step's layer is kept whole or not at
# all, so they only cost time.
ARG BASE=hpcbox/debian:trixie

# mksquashfs's gzip through libdeflate (zlib-libdeflate.c), compiled in a stage of its own so that the
# compiler stays out of the helper.
FROM ${BASE} AS zlib-libdeflate
COPY add-suites.sh apt-helper-build.txt zlib-libdeflate.c /tmp/helper/
RUN --mount=type=secret,id=apt_mirror sh /tmp/helper/add-suites.sh \
 && grep -v '^#' /tmp/helper/apt-helper-build.txt \
    | xargs env DEBIAN_FRONTEND=noninteractive apt-get -o Dpkg::Options::=--force-unsafe-io install -y \
      --no-install-recommends \
 && gcc -O2 -Wall -Wextra -Werror -shared -fPIC -o /zlib-libdeflate.so /tmp/helper/zlib-libdeflate.c -ldeflate

FROM ${BASE}
COPY add-suites.sh apt-helper.txt /tmp/helper/
RUN --mount=type=secret,id=apt_mirror sh /tmp/helper/add-suites.sh \
 && grep -v '^#' /tmp/helper/apt-helper.txt \
    | xargs env DEBIAN_FRONTEND=noninteractive apt-get -o Dpkg::Options::=--force-unsafe-io install -y \
      --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/helper /var/log/*.log /var/log/apt \
    /tmp/hpcbox-apt /etc/apt/apt.conf.d/00hpcbox-mirror \
 && apptainer --version && mksquashfs -version | head -n1
COPY --from=zlib-libdeflate /zlib-libdeflate.so /usr/local/lib/hpcbox/zlib-libdeflate.so
LABEL org.opencontainers.image.title="hpcbox apptainer helper"
