#!/bin/sh
# Adds Debian sid (unstable) beside the image's own suite, from the same mirror, pinned low (priority
# 100): only packages asked for by version or as name/sid come from it, with what they strictly need.
# Apptainer is in sid only. The sid Release file can be past its Valid-Until date, hence the flag.
# Used by helper.Dockerfile and by `hpcbox lock` (which resolves apt-helper.txt with it).
set -eu
sed -n -E 's#^deb ([^ ]+) [a-z]+ main.*#deb \1 sid main#p' /etc/apt/sources.list > /etc/apt/sources.list.d/sid.list
test -s /etc/apt/sources.list.d/sid.list
printf 'Package: *\nPin: release n=sid\nPin-Priority: 100\n' > /etc/apt/preferences.d/10-sid-low
apt-get -o Acquire::Check-Valid-Until=false update -qq
