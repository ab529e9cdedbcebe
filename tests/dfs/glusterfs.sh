#!/bin/bash
# GlusterFS on loopback for tests: glusterd, a replica-3 volume of three bricks, N FUSE
# mounts. The stricter profile: unaligned O_DIRECT fails as on a disk, fsync is real.
#
#   BASE=/scratch BRICK_PORT=49300 MOUNTS=3 tests/dfs/glusterfs.sh up
#   BASE=/scratch tests/dfs/glusterfs.sh down
#
# Needs root and /dev/fuse; installs the Debian packages when they are absent. glusterd's
# working directory, run directory, socket and logs live under BASE; glusterd and the
# bricks listen on 127.0.0.2 only (the CLI refuses "localhost"/"127.0.0.1" as a brick
# host, any other loopback address passes and counts as local). glusterd keeps its
# standard port 24007 (bricks fetch their volfile there and take no other port), so two
# clusters at once need two addresses: GLUSTER_HOST (default 127.0.0.2) picks this one's;
# bricks take free ports from BRICK_PORT on.
set -euo pipefail
BASE=${BASE:?set BASE to a scratch directory}
cmd=${1:?usage: glusterfs.sh up|down}
on_error() {
  echo "glusterfs.sh: failed at line $1" >&2
  tail -n 3 "$BASE"/log/*.log 2>/dev/null >&2 || true
}
trap 'on_error $LINENO' ERR
HOST=${GLUSTER_HOST:-127.0.0.2}
VOL=kv

cli() { gluster --mode=script --glusterd-sock="$BASE/glusterd.sock" "$@"; }

down() {
  for m in "$BASE"/mnt*; do
    [ -d "$m" ] || continue
    if mountpoint -q "$m"; then umount -l "$m" 2>/dev/null || true; fi
  done
  # Every process we started runs with BASE in its command line; kill them by PID.
  local pids
  pids=$(ps -eo pid=,args= | awk -v b="$BASE/" 'index($0, b) && $2 ~ /gluster/ {print $1}')
  for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
  for p in $pids; do
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
  done
  rm -f /var/log/glusterfs/bricks/"$(echo "${BASE#/}" | tr / -)"-b?-brick.log
  rm -rf "$BASE"
}

up() {
  local P_GD=24007 P_BRICK=${BRICK_PORT:-49152}
  local mounts=${MOUNTS:-1}
  export DEBIAN_FRONTEND=noninteractive
  if ! command -v glusterd >/dev/null || ! command -v mount.glusterfs >/dev/null; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends glusterfs-server glusterfs-client >/dev/null
  fi
  mkdir -p "$BASE/glusterd" "$BASE/run" "$BASE/log" "$BASE"/b{1,2,3}
  cat > "$BASE/glusterd.vol" <<CFG
volume management
    type mgmt/glusterd
    option working-directory $BASE/glusterd
    option run-directory $BASE/run
    option glusterd-sockfile $BASE/glusterd.sock
    option transport-type socket
    option transport.socket.bind-address $HOST
    option transport.socket.listen-port $P_GD
    option transport.socket.keepalive-time 10
    option transport.socket.keepalive-interval 2
    option transport.socket.read-fail-log off
    option ping-timeout 0
    option event-threads 1
    option base-port $P_BRICK
    option max-port $((P_BRICK + 200))
end-volume
CFG
  glusterd -f "$BASE/glusterd.vol" -p "$BASE/glusterd.pid" -l "$BASE/log/glusterd.log"
  for _ in $(seq 1 100); do cli pool list >/dev/null 2>&1 && break; sleep 0.1; done
  cli volume create "$VOL" replica 3 \
    "$HOST:$BASE/b1/brick" "$HOST:$BASE/b2/brick" "$HOST:$BASE/b3/brick" force >/dev/null
  # A hung brick is detected after ping-timeout (default 42 s: far too long for tests).
  cli volume set "$VOL" network.ping-timeout 5 >/dev/null
  # Daemons on several clients creating one directory name at once can leave the replicas
  # with different gfids for it (EIO from then on); this policy lets the lookup heal it.
  # storage_nodes/sharedfs/README.md asks the same of production volumes.
  cli volume set "$VOL" cluster.favorite-child-policy mtime >/dev/null
  cli volume start "$VOL" >/dev/null
  for i in $(seq 1 "$mounts"); do
    mkdir -p "$BASE/mnt$i"
    mount -t glusterfs -o "log-file=$BASE/log/client$i.log" \
      "$HOST:/$VOL" "$BASE/mnt$i"
  done
  echo ok > "$BASE/mnt1/.probe" && [ "$(cat "$BASE/mnt1/.probe")" = ok ] && rm -f "$BASE/mnt1/.probe"
  cli volume status "$VOL" detail > "$BASE/status.txt" 2>&1 || true
}

case "$cmd" in
  up) up ;;
  down) down ;;
  *) echo "usage: glusterfs.sh up|down" >&2; exit 2 ;;
esac
