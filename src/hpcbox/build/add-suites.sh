#!/bin/sh
# Adds Debian sid (unstable), and each suite named as an argument (bookworm, for its Slurm), beside the
# image's own suite, from the same mirror, pinned low (priority 100): only packages asked for by version
# or as name/suite come from them, with what they strictly need. Apptainer is in sid only. sid's Release
# file can be past its Valid-Until date, hence the flag. Used by the SIF helper's and the mini cluster
# node's Dockerfiles, and by `hpcbox lock`, which resolves their locks with it.
set -eu
own=$(sed -n "s/^VERSION_CODENAME=//p" /etc/os-release)
suites=sid
for suite in "$@"; do
    case " $own $suites " in *" $suite "*) ;; *) suites="$suites $suite" ;; esac
done
add() {  # the sources of $1 for each suite, into the folder $2
    for suite in $suites; do
        sed -n -E "s#^deb ([^ ]+) [a-z]+ main.*#deb \\1 $suite main#p" "$1" > "$2/$suite.list"
        test -s "$2/$suite.list"
    done
}
add /etc/apt/sources.list /etc/apt/sources.list.d
for suite in $suites; do
    printf 'Package: *\nPin: release n=%s\nPin-Priority: 100\n' "$suite" > "/etc/apt/preferences.d/10-$suite-low"
done
# A mirror handed in (the snapshot archive the pins were resolved from, once the mirror has dropped
# one): apt reads copies of the sources naming it, so /etc/apt keeps naming Debian's mirror. The
# Dockerfiles remove /tmp/hpcbox-apt and 00hpcbox-mirror after their install.
mirror=/run/secrets/apt_mirror
if [ -s "$mirror" ]; then
    mkdir -p /tmp/hpcbox-apt/parts
    sed -E "s#[a-z]+://[^ ]+/debian( |\$)#$(cat "$mirror")\1#g" /etc/apt/sources.list > /tmp/hpcbox-apt/sources.list
    add /tmp/hpcbox-apt/sources.list /tmp/hpcbox-apt/parts
    printf 'Dir::Etc::SourceList "/tmp/hpcbox-apt/sources.list";\nDir::Etc::SourceParts "/tmp/hpcbox-apt/parts";\n' \
        > /etc/apt/apt.conf.d/00hpcbox-mirror
fi
apt-get -o Acquire::Check-Valid-Until=false update -qq
