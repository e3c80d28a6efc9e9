#!/bin/bash
# squashfuse (or squashfuse_ll) built before zstd (`cluster.up --zstd no`): the node's own binary, kept
# in /usr/local/lib/hpcbox-site/real, mounts every image but a zstd one, which it refuses as squashfuse
# itself does. Apptainer calls it as `squashfuse_ll -f -o ...,offset=N IMAGE MOUNTPOINT`.
real=/usr/local/lib/hpcbox-site/real/${0##*/}
offset=0 image=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case ${args[i]} in
        -o) [[ ${args[i + 1]} =~ (^|,)offset=([0-9]+) ]] && offset=${BASH_REMATCH[2]}; i=$((i + 1)) ;;
        -*) ;;
        *) [[ -z $image ]] && image=${args[i]} ;;
    esac
done
# The superblock's compression id (2 bytes at 20): 6 is zstd. Apptainer runs this with no PATH.
compression=$(/usr/bin/od -An -tu2 -j $((offset + 20)) -N2 "$image" 2>/dev/null)
if [[ ${compression//[[:space:]]/} == 6 ]]; then
    echo "Squashfs image uses zstd compression, this version supports only zlib, xz, lzo, lz4." >&2
    exit 1
fi
exec "$real" "$@"
