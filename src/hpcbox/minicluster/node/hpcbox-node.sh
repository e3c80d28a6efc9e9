#!/bin/bash
# Entry point of every mini-cluster container: `hpcbox-node accounting|controller|compute|login`;
# `hpcbox-node software` applies a changed container runtime or FUSE to a running compute or login node.
#
# Configuration and secrets are copied into /etc/hpcbox-init by `up` before the container starts
# (never baked into the image); this script installs them with the owners and modes the daemons
# insist on, then runs the role's daemons. It is safe to run again when a stopped container is
# started again (a compute node brought back after a failure test).
set -euo pipefail

role=${1:?usage: hpcbox-node accounting|controller|compute|login|software}
init=/etc/hpcbox-init
user=researcher

log() { echo "hpcbox-node[$role]: $*" >&2; }

# The cluster's shape (fake GPUs, scratch, site areas, QOS, runtime), also read by the site's prolog scripts.
site_env() {
    install -m 0644 "$init/node.env" /etc/hpcbox-site.env
    # shellcheck source=/dev/null
    . /etc/hpcbox-site.env
}

install_common() {
    install -d -m 0755 /etc/slurm
    install -m 0644 "$init/slurm.conf" /etc/slurm/slurm.conf
    install -m 0644 "$init/gres.conf" /etc/slurm/gres.conf
    if [ -f "$init/cgroup.conf" ]; then
        install -m 0644 "$init/cgroup.conf" /etc/slurm/cgroup.conf
    else
        rm -f /etc/slurm/cgroup.conf
    fi
    if [ -f "$init/job_submit.lua" ]; then install -m 0644 "$init/job_submit.lua" /etc/slurm/job_submit.lua; fi
    site_env
    install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
    install -d -o munge -g munge -m 0755 /run/munge
    install -o munge -g munge -m 0400 "$init/munge.key" /etc/munge/munge.key
    rm -f /run/munge/munged.pid
    runuser -u munge -- /usr/sbin/munged --force
}

# Retry `$@` once a second for up to $1 seconds.
wait_for() {
    local seconds=$1
    shift
    for _ in $(seq "$seconds"); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 1
    done
    log "gave up after ${seconds}s waiting for: $*"
    return 1
}

accounting() {
    install -o slurm -g slurm -m 0600 "$init/slurmdbd.conf" /etc/slurm/slurmdbd.conf
    install -d -o mysql -g mysql /run/mysqld
    # Snapshot isolation off, as Slurm's accounting docs ask: MariaDB 11.6+ (trixie's 11.8) turns it on,
    # and then a write that meets a concurrent one is an error slurmdbd treats as fatal (slurmdbd 26.05
    # checks it at start and says so; the older ones meet it only when it happens).
    mariadbd --user=mysql --bind-address=127.0.0.1 --skip-name-resolve --innodb-snapshot-isolation=OFF &
    wait_for 60 mariadb-admin ping
    local password
    password=$(sed -n 's/^StoragePass=//p' /etc/slurm/slurmdbd.conf)
    # The database exists before slurmdbd first connects: when it does not, slurmdbd creates it and
    # reconnects on the same handle, which libmariadb 11.8.9 leaves unable to read any result
    # ("Number of columns in result (=1) ... (=0)", a fatal error in _check_mysql_concat_is_sane).
    mariadb <<SQL
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '${password}';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '${password}';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
SQL
    slurmdbd -D &
    wait_for 60 sacctmgr --noheader show cluster
    local cluster
    cluster=$(sed -n 's/^ClusterName=//p' /etc/slurm/slurm.conf)
    sacctmgr --immediate add cluster "$cluster" >/dev/null || true
    sacctmgr --immediate add account research Cluster="$cluster" Description=research Organization=hpcbox \
        >/dev/null || true
    local qos qos_list=normal
    for qos in $HPCBOX_QOS; do
        sacctmgr --immediate add qos "$qos" >/dev/null || true
        qos_list="$qos_list,$qos"
    done
    sacctmgr --immediate add user "$user" Account=research Cluster="$cluster" QOS="$qos_list" \
        DefaultQOS=normal >/dev/null || true
    log "ready"
    wait -n
}

controller() {
    # Start only once accounting knows the cluster and its user, so no job goes unrecorded.
    wait_for 120 sh -c "sacctmgr --noheader --parsable2 show user $user | grep -q '^$user|'"
    exec slurmctld -D
}

compute() {
    if [ -n "${HPCBOX_CGROUPS:-}" ]; then node_cgroups; fi
    fake_gpus
    users_software
    # Only the shape's scratch: a node of a site without node-local disk has no /disk/scratch either.
    install -d -m 1777 "${HPCBOX_SCRATCH_DIR:?}"
    site_areas
    exec slurmd -D
}

# Slurm's cgroups (cgroup.conf), of the engine's cgroup version ($HPCBOX_CGROUPS): the node has a cgroup
# namespace of its own whose root is its container's cgroup, mounted read-only by Docker; with
# CAP_SYS_ADMIN it becomes writable, and slurmd makes each job's cgroups under it, apart from every other
# node's.
node_cgroups() {
    case "$HPCBOX_CGROUPS" in
        1) node_cgroups_v1 ;;
        2) node_cgroups_v2 ;;
        *) log "unknown cgroup version in node.env: '$HPCBOX_CGROUPS'"; exit 1 ;;
    esac
}

node_cgroups_v1() {
    local controller
    for controller in cpuset memory devices freezer; do
        if ! mount -o remount,bind,rw "/sys/fs/cgroup/$controller"; then
            log "cannot make /sys/fs/cgroup/$controller writable: this engine gives the node no cgroup v1" \
                "controllers of its own; bring the cluster up without cgroups"
            exit 1
        fi
    done
}

# cgroup v2 lets a cgroup hand controllers to its children only while no process is in it (the "no
# internal processes" rule), and every process of the node (tini, this script, munged) starts in the
# namespace's root: they move to a child of their own first, then the root enables every controller it
# has for its children, among them those Slurm constrains with (cpuset, cpu, memory, pids), under which
# slurmd (IgnoreSystemd: no systemd here to delegate it a subtree) makes its stepd scope. A process that
# `docker exec` puts into the root meanwhile fails the enabling (EBUSY): it moves too, and the enabling is
# tried again; once the root has controllers, runc puts such a process into tini's cgroup instead.
node_cgroups_v2() {
    local root=/sys/fs/cgroup attempt pid pids controller controllers
    if [ ! -f "$root/cgroup.controllers" ] || ! mount -o remount,bind,rw "$root"; then
        log "cannot make $root writable as a cgroup v2 tree: this engine gives the node no cgroups of" \
            "its own; bring the cluster up without cgroups"
        exit 1
    fi
    for controller in cpuset cpu memory pids; do
        if ! grep -qw "$controller" "$root/cgroup.controllers"; then
            log "the engine gives the node's cgroup no $controller controller ($(cat "$root/cgroup.controllers")):" \
                "Slurm cannot constrain with it; bring the cluster up without cgroups"
            exit 1
        fi
    done
    mkdir -p "$root/hpcbox-node"
    read -ra controllers <"$root/cgroup.controllers"
    for attempt in $(seq 10); do
        mapfile -t pids <"$root/cgroup.procs"
        for pid in "${pids[@]}"; do
            echo "$pid" >"$root/hpcbox-node/cgroup.procs" 2>/dev/null || true # one that has exited meanwhile
        done
        for controller in "${controllers[@]}"; do
            grep -qw "$controller" "$root/cgroup.subtree_control" && continue
            echo "+$controller" >"$root/cgroup.subtree_control" 2>/dev/null || continue 2
        done
        # Slurm 22.05 makes its stepd scope in system.slice but neither system.slice itself (its slurmd
        # fails its cgroup plugin's start without it) nor the slice's controllers for the scope (without
        # them its jobs' cgroups have no memory.max: nothing enforced); later releases make both.
        mkdir -p "$root/system.slice"
        for controller in "${controllers[@]}"; do
            echo "+$controller" >"$root/system.slice/cgroup.subtree_control"
        done
        return 0
    done
    log "processes kept arriving in the node's root cgroup: its controllers are not enabled after $attempt tries"
    exit 1
}

# Fake GPU devices, with no GPU behind them. Character devices, not plain files: Slurm sets
# CUDA_VISIBLE_DEVICES and SLURM_JOB_GPUS only for a device file. With cgroups, each has numbers of its
# own (major 120, one Linux keeps for local use: no driver, so opening one says "No such device or
# address") which the node's cgroup may open (on cgroup v1 allowed here one by one, on v2 by Docker's
# device rule, nodes.py), and Slurm's ConstrainDevices lets a job open only those it was given
# ("Operation not permitted" for the others). Without, each is a link to /dev/null that any job can open:
# Slurm follows it to a device file, and a rootless engine's node (in a user namespace) can make no
# device node of its own.
fake_gpus() {
    local index
    for index in $(seq 0 $((${HPCBOX_FAKE_GPUS:?} - 1))); do
        rm -f "/dev/fakegpu$index"
        if [ -n "${HPCBOX_CGROUPS:-}" ]; then
            mknod -m 0666 "/dev/fakegpu$index" c 120 "$index"
            if [ "$HPCBOX_CGROUPS" = 1 ]; then echo "c 120:$index rwm" >/sys/fs/cgroup/devices/devices.allow; fi
        else
            ln -s /dev/null "/dev/fakegpu$index"
        fi
    done
}

# The container runtime users find, as node.env says (`hpcbox-node software` applies a new one in place).
# Apptainer runs unprivileged (user namespaces), as on a real cluster's compute nodes; FUSE lets it mount
# a SIF, and without FUSE for users (/dev/fuse root's alone) it cannot, as at a site without FUSE.
# `singularity` alone: the command SingularityCE sites have, which is Apptainer's own alias here
# (SingularityCE is not in Debian).
is_binary() {
    [ -f "$1" ] && [ ! -L "$1" ] && [ "$(head -c 4 "$1" | tail -c 3)" = ELF ]
}

container_software() {
    # Docker masks parts of the node's /proc, and the kernel then refuses a new proc mount in a user
    # namespace: Apptainer makes one for an unpacked SIF (and to unpack one). It binds the node's /proc
    # instead, as it already does for a SIF it mounts.
    sed -i 's/^mount proc = yes$/mount proc = no/' /etc/apptainer/apptainer.conf
    grep -qx 'bind path = /proc' /etc/apptainer/apptainer.conf || echo 'bind path = /proc' >>/etc/apptainer/apptainer.conf
    # Apptainer finds its configuration from where its binary is, so it stays in /usr/bin, by either
    # name; it also runs /usr/bin/apptainer to unpack an image, which the stand-in answers for it alone.
    if [ "${HPCBOX_RUNTIME:?}" = singularity ]; then
        if is_binary /usr/bin/apptainer; then mv -f /usr/bin/apptainer /usr/bin/singularity; fi
        install -m 0755 /usr/local/lib/hpcbox-site/apptainer-hidden.sh /usr/bin/apptainer
    else
        if ! is_binary /usr/bin/apptainer; then mv -f /usr/bin/singularity /usr/bin/apptainer; fi
        ln -sfn apptainer /usr/bin/singularity
    fi
    if [ -e /dev/fuse ]; then
        local mode=600
        if [ -n "$HPCBOX_FUSE" ]; then mode=666; fi
        # A rootless engine's /dev/fuse is the host's own, bound in: its node cannot change the mode.
        chmod "$mode" /dev/fuse 2>/dev/null \
            || log "/dev/fuse stays $(stat -c %a /dev/fuse), the host's: a rootless engine's node cannot change it"
    fi
    squashfs_tools
}

# squashfuse, with which Apptainer mounts a SIF: the node image's own (kept in real/ whatever this node
# has now, so that a change in place can go either way), none, or a stand-in that refuses zstd images.
squashfs_tools() {
    local real=/usr/local/lib/hpcbox-site/real name
    mkdir -p "$real"
    for name in squashfuse squashfuse_ll; do
        if is_binary "/usr/bin/$name"; then mv -f "/usr/bin/$name" "$real/$name"; fi
        rm -f "/usr/bin/$name"
        if [ -z "$HPCBOX_SQUASHFUSE" ]; then
            continue
        elif [ -n "$HPCBOX_ZSTD" ]; then
            cp -p "$real/$name" "/usr/bin/$name"
        else
            install -m 0755 /usr/local/lib/hpcbox-site/squashfuse-no-zstd.sh "/usr/bin/$name"
        fi
    done
}

# What users meet on a compute or login node: the container runtime, and a `module` stub where the
# rehearsed site loads Apptainer with environment modules.
users_software() {
    container_software
    if [ -n "$HPCBOX_MODULE_STUB" ]; then ln -sf /usr/local/lib/hpcbox-site/module.sh /usr/local/bin/module; fi
}

# The site's shared areas (/project, /scratch ...): folders on the shared data volume, linked from the
# site's path on every node that mounts it.
site_areas() {
    local area name
    for area in $HPCBOX_SITE_AREAS; do
        install -d -m 1777 "$HPCBOX_SITE_AREAS_DIR$area"
        if [ ! -e "$area" ]; then ln -s "$HPCBOX_SITE_AREAS_DIR$area" "$area"; fi
    done
    # Areas the site names by a variable its login sets ($SCRATCH): a folder each, exported at login.
    : >/etc/profile.d/hpcbox-site-areas.sh
    for name in ${HPCBOX_AREA_VARIABLES:-}; do
        install -d -m 1777 "$HPCBOX_SITE_AREAS_DIR/$name"
        echo "export $name=$HPCBOX_SITE_AREAS_DIR/$name" >>/etc/profile.d/hpcbox-site-areas.sh
    done
}

login() {
    install -m 0600 "$init/ssh_host_ed25519_key" /etc/ssh/ssh_host_ed25519_key
    install -m 0644 "$init/ssh_host_ed25519_key.pub" /etc/ssh/ssh_host_ed25519_key.pub
    local home=/home/$user
    # The shared /home volume starts empty (mounted with nocopy): make the user's home as useradd would.
    if [ ! -d "$home" ]; then
        install -d -o "$user" -g "$user" -m 0755 "$home"
        cp -a /etc/skel/. "$home/"
        chown -R "$user:$user" "$home"
    fi
    install -d -o "$user" -g "$user" -m 0700 "$home/.ssh"
    install -o "$user" -g "$user" -m 0600 "$init/authorized_keys" "$home/.ssh/authorized_keys"
    install -d -o "$user" -g "$user" -m 0755 "/data/$user"
    site_areas
    users_software
    exec /usr/sbin/sshd -D -e
}

if [ "$role" = software ]; then
    site_env
    container_software
    exit 0
fi
install_common
case "$role" in
    accounting) accounting ;;
    controller) controller ;;
    compute) compute ;;
    login) login ;;
    *) log "unknown role"; exit 2 ;;
esac
