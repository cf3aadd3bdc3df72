#!/usr/bin/env bash
# A throwaway one-node Ceph cluster (one monitor, one BlueStore OSD on a file) on loopback, under
# one directory, without systemd: for ckptd's RADOS tests and benchmarks.
#
#   scripts/ceph-one-node.sh start DIR [POOL]   bootstraps, creates POOL (default "ckptd"), and
#                                              returns once an object can be written to it;
#                                              prints CEPH_CONF=DIR/ceph.conf
#   scripts/ceph-one-node.sh start-rgw DIR PORT  starts an S3 gateway (radosgw, Debian's
#                                              `radosgw`) on 127.0.0.1:PORT for the cluster
#                                              started in DIR, with the S3 user whose keys are
#                                              $S3_ACCESS_KEY and $S3_SECRET_KEY; returns once it
#                                              answers; prints S3_ENDPOINT=http://127.0.0.1:PORT
#   scripts/ceph-one-node.sh stop DIR           kills the daemons by their recorded PIDs
#
# Gives up (and kills what it started) if the pool is not writable within $CEPH_START_TIMEOUT
# seconds (default 90).
# Ports: the monitor listens on 127.0.0.1 at $CEPH_MON_PORT (v2, default 3300) and
# $CEPH_MON_PORT_V1 (default 6789). Everything else (keyrings, data, logs, sockets) stays in DIR.
set -euo pipefail

cmd=${1:?usage: ceph-one-node.sh start|start-rgw|stop DIR [POOL|PORT]}
dir=${2:?usage: ceph-one-node.sh start|start-rgw|stop DIR [POOL|PORT]}
pool=${3:-ckptd}
v2=${CEPH_MON_PORT:-3300}
v1=${CEPH_MON_PORT_V1:-6789}

stop() {
  for pidfile in "$dir"/*.pid; do
    [[ -e "$pidfile" ]] || continue
    kill -9 "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  done
}

if [[ "$cmd" == stop ]]; then
  stop
  exit 0
fi
if [[ "$cmd" == start-rgw ]]; then
  port=${3:?usage: ceph-one-node.sh start-rgw DIR PORT}
  dir=$(cd "$dir" && pwd)
  export CEPH_CONF="$dir/ceph.conf"
  : "${S3_ACCESS_KEY:?set S3_ACCESS_KEY}" "${S3_SECRET_KEY:?set S3_SECRET_KEY}"
  mkdir -p "$dir/rgw"
  # tcp_nodelay: without it every small answer (headers, then a short body) waits on the
  # client's delayed ACK before its last segment leaves.
  radosgw -n client.admin -f --rgw-frontends "beast endpoint=127.0.0.1:$port tcp_nodelay=1" \
    --rgw-data "$dir/rgw" --log-file "$dir/log/rgw.log" >"$dir/log/rgw.out" 2>&1 &
  echo $! >"$dir/rgw.pid"
  deadline=$((SECONDS + ${CEPH_START_TIMEOUT:-90}))
  until [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/")" == 200 ]]; do
    if ((SECONDS >= deadline)) || ! kill -0 "$(cat "$dir/rgw.pid")" 2>/dev/null; then
      echo "ceph-one-node: radosgw not answering on port $port; logs in $dir/log" >&2
      kill -9 "$(cat "$dir/rgw.pid")" 2>/dev/null || true
      exit 1
    fi
    sleep 0.1
  done
  if ! timeout 60 radosgw-admin user create --uid=ckptd --display-name=ckptd \
    --access-key="$S3_ACCESS_KEY" --secret="$S3_SECRET_KEY" >"$dir/log/rgw-user.out" 2>&1; then
    echo "ceph-one-node: could not create the S3 user; logs in $dir/log" >&2
    kill -9 "$(cat "$dir/rgw.pid")" 2>/dev/null || true
    exit 1
  fi
  echo "S3_ENDPOINT=http://127.0.0.1:$port"
  exit 0
fi
[[ "$cmd" == start ]] || { echo "unknown command $cmd" >&2; exit 2; }
# Any failing step leaves nothing running.
trap 'echo "ceph-one-node: a step failed; logs in $dir/log" >&2; stop' ERR

mkdir -p "$dir"/{mon,osd,run,log,crash}
dir=$(cd "$dir" && pwd)
export CEPH_CONF="$dir/ceph.conf"
fsid=$(cat /proc/sys/kernel/random/uuid)
cat >"$CEPH_CONF" <<EOF
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:$v2,v1:127.0.0.1:$v1]
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
keyring = $dir/keyring
run dir = $dir/run
log file = $dir/log/\$name.log
crash dir = $dir/crash
admin socket = $dir/run/\$name.asok
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
paxos propose interval = 0.1
mon warn on pool no redundancy = false
[mon]
mon data = $dir/mon/\$cluster-\$id
[osd]
osd data = $dir/osd/\$cluster-\$id
keyring = $dir/osd/\$cluster-\$id/keyring
osd objectstore = bluestore
bluestore block create = true
bluestore block size = 4294967296
bluestore cache size = 134217728
osd memory target = 536870912
EOF

ceph-authtool --create-keyring "$dir/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
ceph-authtool "$dir/keyring" --gen-key -n client.admin --cap mon 'allow *' --cap osd 'allow *' \
  --cap mgr 'allow *' --cap mds 'allow *' >/dev/null
monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$v2,v1:127.0.0.1:$v1]" \
  "$dir/monmap" >/dev/null
ceph-mon --cluster ceph --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/keyring" \
  >"$dir/log/mkfs-mon.out" 2>&1
ceph-mon -i a -f >"$dir/log/mon.out" 2>&1 &
echo $! >"$dir/mon.pid"

uuid=$(cat /proc/sys/kernel/random/uuid)
osd_id=$(timeout 30 ceph osd new "$uuid")
mkdir -p "$dir/osd/ceph-$osd_id"
ceph-authtool "$dir/osd/ceph-$osd_id/keyring" --create-keyring --gen-key -n "osd.$osd_id" \
  >/dev/null
timeout 30 ceph auth add "osd.$osd_id" osd 'allow *' mon 'allow profile osd' mgr 'allow profile osd' \
  -i "$dir/osd/ceph-$osd_id/keyring" >/dev/null 2>&1
ceph-osd -i "$osd_id" --mkfs --osd-uuid "$uuid" >"$dir/log/mkfs-osd.out" 2>&1
ceph-osd -i "$osd_id" -f >"$dir/log/osd.out" 2>&1 &
echo $! >"$dir/osd.pid"

timeout 30 ceph osd pool create "$pool" 8 8 >/dev/null 2>&1
# Ready when a real write lands (without a manager `ceph -s` shows no pools, but I/O works).
echo ready >"$dir/probe"
deadline=$((SECONDS + ${CEPH_START_TIMEOUT:-90}))
while ((SECONDS < deadline)); do
  if timeout 10 rados -p "$pool" put ckptd-probe "$dir/probe" 2>/dev/null; then
    timeout 10 rados -p "$pool" rm ckptd-probe 2>/dev/null || true
    echo "CEPH_CONF=$CEPH_CONF"
    exit 0
  fi
  sleep 0.1
done
echo "ceph-one-node: pool $pool not writable after ${CEPH_START_TIMEOUT:-90} s; logs in $dir/log" >&2
stop
exit 1
