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
# BuildKit's cache of downloads, where the Dockerfile mounts it (a cache mount, in no layer) at /mnt: a
# folder every Debian base has, empty (a mount point BuildKit had to make would stay in the layer).
debs=""
if mountpoint -q /mnt; then
    debs=/mnt
fi
# --error-on=any: a source that cannot be fetched fails here, not as "unable to locate" further on
apt-get "$@" update --error-on=any
# What the step installs: each package's file as apt names it (its version's ":" written "%3a"),
# SHA256 and size, from the index fetched and verified above. (An upgrade's line says the version
# installed first: `Inst name [old] (new ...`.) Errors are the install's to say, below.
grep -v -e '^#' -e '^$' "$lock" \
    | xargs apt-get "$@" --simulate install -y --no-install-recommends 2>/dev/null \
    | sed -n 's/^Inst \([^ ]*\) \(\[[^]]*\] \)\{0,1\}(\([^ ]*\) .*/\1=\3/p' >/tmp/hpcbox-installs
: >/tmp/hpcbox-debs
if [ -s /tmp/hpcbox-installs ]; then
    xargs apt-cache show </tmp/hpcbox-installs | awk '
        /^Package: / {package = $2} /^Version: / {version = $2} /^Architecture: / {arch = $2}
        /^Size: / {size = $2}
        /^SHA256: / {gsub(":", "%3a", version); print package "_" version "_" arch ".deb", $2, size}' \
        | sort -u >/tmp/hpcbox-debs
fi

# What the step downloads, said before it does. apt takes a package it finds in the cache of downloads
# on its size alone, so each one this step would take from there is checked first against the index's
# SHA256, and removed where it differs: apt then downloads it again.
take_stock() {
    total=0 cached=0 bytes=0
    while read -r file sha256 size; do
        total=$((total + 1))
        if [ -n "$debs" ] && [ -f "$debs/$file" ]; then
            if echo "$sha256  $debs/$file" | sha256sum --check --status; then
                cached=$((cached + 1))
                continue
            fi
            echo "hpcbox: $file in the build's cache of downloads is not the package Debian's index names;" \
                "downloading it again"
            rm -f "$debs/$file"
        fi
        bytes=$((bytes + size))
    done </tmp/hpcbox-debs
    [ "$total" -gt 0 ] || return 0
    amount=$(awk -v bytes="$bytes" 'BEGIN {
        if (bytes < 1e6) printf "%.0f kB", bytes / 1e3; else printf "%.1f MB", bytes / 1e6 }')
    said="hpcbox: this step installs $total package$([ "$total" -eq 1 ] || echo s)"
    if [ "$cached" -eq "$total" ]; then
        echo "$said, all in the build's cache of downloads"
    elif [ "$cached" -gt 0 ]; then
        echo "$said, $((total - cached)) to download ($amount), the others in the build's cache of downloads"
    else
        echo "$said, $total to download ($amount)"
    fi
}
if [ -n "$debs" ]; then
    # Builds at once share the cache (BuildKit's `sharing=shared`): one at a time takes stock, downloads
    # what the cache lacks (so a step run again for one package added to its lock downloads that one
    # alone) and copies out what its step installs. The install, the step's long part, runs after, on
    # those copies.
    exec 9>"$debs/hpcbox.lock"
    flock 9
    take_stock
    grep -v -e '^#' -e '^$' "$lock" | xargs apt-get "$@" -o Dir::Cache::Archives="$debs/" \
        install -y --download-only --no-install-recommends
    while read -r file _; do
        cp "$debs/$file" /var/cache/apt/archives/ 2>/dev/null || true  # else the install downloads it
    done </tmp/hpcbox-debs
    exec 9>&-
else
    take_stock
fi
rm -f /tmp/hpcbox-installs /tmp/hpcbox-debs
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
