#!/bin/sh
# Install the pinned Debian packages listed in a lock file (`name=version` per line, `#` comments).
# The host's CA bundle, when `hpcbox build` hands one in, arrives as a BuildKit secret: it is used
# for https mirrors during this step and never written to a layer.
set -eu
lock=$1
ca=/run/secrets/host_ca
set --
if [ -s "$ca" ]; then
    echo "hpcbox: host CA bundle mounted for this step ($(wc -c <"$ca") bytes)"
    set -- -o "Acquire::https::CAInfo=$ca"
fi
if [ -n "${DEBIAN_MIRROR:-}" ]; then
    for sources in /etc/apt/sources.list /etc/apt/sources.list.d/debian.sources; do
        # the main archive only (a URL ending in /debian), not debian-security
        if [ -f "$sources" ]; then
            sed -i -E "s#[a-z]+://[^ ]+/debian( |\$)#${DEBIAN_MIRROR}\1#g" "$sources"
        fi
    done
fi
apt-get "$@" update
grep -v -e '^#' -e '^$' "$lock" | xargs apt-get "$@" install -y --no-install-recommends
# Caches and logs that record when and where the step ran (so no two builds would match), not what
# it installed: ldconfig's aux-cache, fontconfig's caches (rebuilt per user on demand), install logs.
rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /var/log/apt /var/log/*.log \
    /var/cache/ldconfig/aux-cache /var/cache/fontconfig/*
