#!/bin/sh
# Adds Debian sid (unstable) beside the image's own suite, from the same mirror, pinned low (priority
# 100): only packages asked for by version or as name/sid come from it, with what they strictly need.
# Apptainer is in sid only. The sid Release file can be past its Valid-Until date, hence the flag.
# Used by helper.Dockerfile and by `hpcbox lock` (which resolves apt-helper.txt with it).
set -eu
sid() { sed -n -E 's#^deb ([^ ]+) [a-z]+ main.*#deb \1 sid main#p' "$1"; }
sid /etc/apt/sources.list > /etc/apt/sources.list.d/sid.list
test -s /etc/apt/sources.list.d/sid.list
printf 'Package: *\nPin: release n=sid\nPin-Priority: 100\n' > /etc/apt/preferences.d/10-sid-low
# A mirror handed in (the snapshot archive the pins were resolved from, once the mirror has dropped
# one): apt reads copies of the sources naming it, so /etc/apt keeps naming Debian's mirror.
# helper.Dockerfile removes /tmp/hpcbox-apt and 00hpcbox-mirror after its install.
mirror=/run/secrets/apt_mirror
if [ -s "$mirror" ]; then
    mkdir -p /tmp/hpcbox-apt/parts
    sed -E "s#[a-z]+://[^ ]+/debian( |\$)#$(cat "$mirror")\1#g" /etc/apt/sources.list > /tmp/hpcbox-apt/sources.list
    sid /tmp/hpcbox-apt/sources.list > /tmp/hpcbox-apt/parts/sid.list
    printf 'Dir::Etc::SourceList "/tmp/hpcbox-apt/sources.list";\nDir::Etc::SourceParts "/tmp/hpcbox-apt/parts";\n' \
        > /etc/apt/apt.conf.d/00hpcbox-mirror
fi
apt-get -o Acquire::Check-Valid-Until=false update -qq
