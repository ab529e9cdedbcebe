#!/bin/bash
# MooseFS on loopback for tests: one master, three chunkservers (goal 2), N FUSE mounts.
#
#   BASE=/scratch PORTS="ml cs cl cs1 cs2 cs3" MOUNTS=3 tests/dfs/moosefs.sh up
#   BASE=/scratch tests/dfs/moosefs.sh down
#
# Needs root and /dev/fuse; installs the Debian packages when they are absent. Every
# address is on loopback, every port comes from PORTS (the caller picks free ones), and
# all state lives under BASE. Each mount is its own mfsmount process (own caches), the
# way separate hosts would see the file system: BASE/mnt1 … BASE/mntN.
#
# Pitfalls this works around: MooseFS refuses chunkservers on 127.0.0.0/8, so the master
# remaps 127.0.0.1 to 0.0.0.0 (which Linux routes back over lo); mfscli always runs with
# -n, or every call makes a reverse-DNS lookup through the system resolver.
set -euo pipefail
BASE=${BASE:?set BASE to a scratch directory}
cmd=${1:?usage: moosefs.sh up|down}
# The daemons run as root: BASE may sit under directories only root can enter (pytest's
# tmp_path), and nothing here is reachable from off the host.
on_error() {
  echo "moosefs.sh: failed at line $1" >&2
  tail -n 3 "$BASE"/master/start.log "$BASE"/cs?/start.log "$BASE"/mount?.log 2>/dev/null >&2 || true
}
trap 'on_error $LINENO' ERR

down() {
  # Unmount lazily first: a dead FUSE server must not hang the caller.
  for m in "$BASE"/mnt*; do
    [ -d "$m" ] || continue
    if mountpoint -q "$m"; then umount -l "$m" 2>/dev/null || true; fi
  done
  local pids=""
  for f in "$BASE"/mfsmount*.pid "$BASE"/cs?/.mfschunkserver.lock "$BASE/master/.mfsmaster.lock"; do
    [ -f "$f" ] || continue
    p=$(tr -dc 0-9 < "$f" 2>/dev/null || true)
    [ -n "$p" ] && kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null && pids="$pids $p"
  done
  for p in $pids; do
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
  done
  rm -rf "$BASE"
}

up() {
  read -r P_ML P_CS P_CL P_C1 P_C2 P_C3 <<<"${PORTS:?set PORTS to six free ports}"
  local mounts=${MOUNTS:-1}
  export DEBIAN_FRONTEND=noninteractive
  if ! command -v mfsmaster >/dev/null || ! command -v mfsmount >/dev/null \
     || ! command -v mfschunkserver >/dev/null || ! command -v mfscli >/dev/null; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends \
      moosefs-master moosefs-chunkserver moosefs-client moosefs-cli >/dev/null
  fi
  mkdir -p "$BASE/master"
  cp /var/lib/mfs/metadata.mfs.empty "$BASE/master/metadata.mfs"
  cat > "$BASE/master/mfsmaster.cfg" <<CFG
WORKING_USER = root
WORKING_GROUP = root
DATA_PATH = $BASE/master
EXPORTS_FILENAME = $BASE/master/mfsexports.cfg
TOPOLOGY_FILENAME = $BASE/master/mfstopology.cfg
MATOML_LISTEN_HOST = 127.0.0.1
MATOML_LISTEN_PORT = $P_ML
MATOCS_LISTEN_HOST = 127.0.0.1
MATOCS_LISTEN_PORT = $P_CS
MATOCL_LISTEN_HOST = 127.0.0.1
MATOCL_LISTEN_PORT = $P_CL
REPLICATIONS_DELAY_INIT = 0
REMAP_BITS = 32
REMAP_SOURCE_IP_CLASS = 127.0.0.1
REMAP_DESTINATION_IP_CLASS = 0.0.0.0
CFG
  printf '127.0.0.1  /  rw,alldirs,admin,maproot=0:0\n127.0.0.1  .  rw\n' \
    > "$BASE/master/mfsexports.cfg"
  : > "$BASE/master/mfstopology.cfg"
  local i port
  for i in 1 2 3; do
    local d=$BASE/cs$i
    eval "port=\$P_C$i"
    mkdir -p "$d/chunks"
    echo "$d/chunks" > "$d/mfshdd.cfg"
    cat > "$d/mfschunkserver.cfg" <<CFG
WORKING_USER = root
WORKING_GROUP = root
DATA_PATH = $d
HDD_CONF_FILENAME = $d/mfshdd.cfg
MASTER_HOST = 0.0.0.0
MASTER_PORT = $P_CS
BIND_HOST = 127.0.0.1
CSSERV_LISTEN_HOST = 127.0.0.1
CSSERV_LISTEN_PORT = $port
HDD_LEAVE_SPACE_DEFAULT = 256MiB
CFG
  done
  mfsmaster -c "$BASE/master/mfsmaster.cfg" start >"$BASE/master/start.log" 2>&1
  for i in 1 2 3; do
    mfschunkserver -c "$BASE/cs$i/mfschunkserver.cfg" start >"$BASE/cs$i/start.log" 2>&1
  done
  local n=0
  for _ in $(seq 1 120); do
    n=$(mfscli -n -H 127.0.0.1 -P "$P_CL" -SCS 2>/dev/null \
        | awk -F'\t' '/^chunk servers:/ && $11 > 0' | wc -l)
    [ "$n" -ge 3 ] && break
    sleep 0.25
  done
  [ "$n" -ge 3 ] || { echo "moosefs: only $n/3 chunkservers registered" >&2; exit 1; }
  for i in $(seq 1 "$mounts"); do
    mkdir -p "$BASE/mnt$i"
    # mfsnice=0: the default (-19) would starve everything else on a shared machine.
    mfsmount "$BASE/mnt$i" -H 127.0.0.1 -P "$P_CL" -o mfsnice=0 >"$BASE/mount$i.log" 2>&1
    pgrep -xf "mfsmount \(mounted on: $BASE/mnt$i\)" > "$BASE/mfsmount$i.pid" || true
  done
  mfssetgoal -r 2 "$BASE/mnt1" >/dev/null
  echo ok > "$BASE/mnt1/.probe" && [ "$(cat "$BASE/mnt1/.probe")" = ok ] && rm -f "$BASE/mnt1/.probe"
}

case "$cmd" in
  up) up ;;
  down) down ;;
  *) echo "usage: moosefs.sh up|down" >&2; exit 2 ;;
esac
