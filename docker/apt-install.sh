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
# The mirror `hpcbox build` hands in (as a secret: it stays out of the cache keys and the image's
# history) serves this step only: the sources are put back after, so the image is the same whichever
# mirror served its packages. It is the snapshot archive once Debian's mirror has dropped a pinned
# version, whose Release files are past their Valid-Until.
mirror=/run/secrets/apt_mirror
sources=""
if [ -s "$mirror" ]; then
    url=$(cat "$mirror")
    echo "hpcbox: packages from $url for this step"
    for file in /etc/apt/sources.list /etc/apt/sources.list.d/debian.sources; do
        if [ -f "$file" ]; then
            sources="$sources $file"
            cp -p "$file" "/tmp/hpcbox-$(basename "$file")"
            # the main archive only (a URL ending in /debian), not debian-security
            sed -i -E "s#[a-z]+://[^ ]+/debian( |\$)#${url}\1#g" "$file"
        fi
    done
    set -- "$@" -o Acquire::Check-Valid-Until=false
fi
# --error-on=any: a source that cannot be fetched fails here, not as "unable to locate" further on
apt-get "$@" update --error-on=any
# dpkg syncs each file it unpacks to disk; a build step's layer is kept whole or not at all, so here the
# syncs only cost time (8 % of the PyTorch step measured): the files are the same without them.
grep -v -e '^#' -e '^$' "$lock" \
    | xargs apt-get "$@" -o Dpkg::Options::=--force-unsafe-io install -y --no-install-recommends
for file in $sources; do
    mv "/tmp/hpcbox-$(basename "$file")" "$file"
done
# Caches and logs that record when and where the step ran (so no two builds would match), not what
# it installed: ldconfig's aux-cache, fontconfig's caches (rebuilt per user on demand), install logs.
rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /var/log/apt /var/log/*.log \
    /var/cache/ldconfig/aux-cache /var/cache/fontconfig/*
