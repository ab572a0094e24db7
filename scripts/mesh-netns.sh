#!/usr/bin/env bash
# Pods with Istio-style sidecar capture, on one Linux host, without Kubernetes.
#
# Each "pod" is a network namespace with a veth into a bridge; its app runs as any user, its
# Envoy sidecar as uid/gid 1337, and the nat rules istio-iptables installs send the app's
# outbound TCP to Envoy's port 15001 and all inbound TCP to Envoy's port 15006.
#
# Address plan (198.18.0.0/15 is the RFC 2544 benchmark range: never routed on the internet):
#
#   198.18.N.0/24    one test network ("NET"), N = 0 by default
#   198.18.N.1       the bridge, in NET's own "router" namespace (the pods' default gateway)
#   198.18.N.2-253   pods
#   198.18.N.254     the root namespace's veth into the bridge (shoal listens here)
#   198.19.0.0/16    service ClusterIPs: virtual, never assigned or routed anywhere
#
#      root netns                  NET-router netns                 NET-<pod> netns
#   +--------------+            +--------------------+          +-------------------+
#   | NET-h        |---veth-----| host      br0      |---veth---| eth0 198.18.N.x   |
#   | 198.18.N.254 |            | v<x>   198.18.N.1  |          | default via .1    |
#   +--------------+            | no default route,  |          | app, Envoy (1337) |
#                               | ip_forward=0       |          | istio nat rules   |
#                               +--------------------+          +-------------------+
#
# Nothing a pod sends can leave the test network: the router namespace only bridges, never
# routes (no default route, forwarding off), and the root namespace's veth has forwarding off.
# A pod's default route exists only so that connect() to a ClusterIP finds a route; the nat
# OUTPUT rules then redirect the connection to the sidecar before a packet is sent.
#
# Usage (as root):
#   mesh-netns.sh up NET [N|auto]        create NET on 198.18.N.0/24; prints the subnet
#   mesh-netns.sh pod NET NAME IP        create pod NAME with address IP (in NET's subnet)
#   mesh-netns.sh attach NET NAME OTHER IP
#                                        give pod NAME of NET a second interface, eth1
#                                        with address IP on network OTHER's bridge (an
#                                        east-west gateway's address in another network)
#   mesh-netns.sh capture NET NAME [-d PORTS]
#                                        install istio-iptables' rules in the pod
#   mesh-netns.sh uncapture NET NAME     remove them
#   mesh-netns.sh exec NET NAME [--uid UID --gid GID] -- CMD...
#                                        run CMD in the pod (as UID/GID: no capabilities)
#   mesh-netns.sh iptables NET NAME      print the pod's nat table (iptables-save)
#   mesh-netns.sh down NET               delete everything of NET (also half-created ones)
#   mesh-netns.sh list                   list the networks that exist
#
# NET is 1-12 characters [a-z0-9]. Namespaces are named NET-router and NET-<pod>; the only
# interface in the root namespace is NET-h. iptables backend: $SHOAL_IPTABLES if set, else
# iptables-nft when it works in the pod, else iptables-legacy (see pick_iptables).
set -euo pipefail

PROG=$(basename "$0")
LOCK=/run/lock/shoal-mesh-netns.lock
[ -d /run/lock ] || LOCK=/tmp/shoal-mesh-netns.lock

die() {
  echo "$PROG: $*" >&2
  exit 1
}

check_net() {
  [[ "$1" =~ ^[a-z0-9]{1,12}$ ]] || die "NET must be 1-12 characters [a-z0-9], not '$1'"
}

router() { echo "$1-router"; }
ns_exists() { ip netns list | awk '{print $1}' | grep -xF "$1" >/dev/null; }
hostif() { echo "$1-h"; }

# The third octet N of NET's subnet, read back from its bridge address 198.18.N.1.
subnet_octet() {
  local addr
  addr=$(ip -n "$(router "$1")" -4 -o addr show dev br0 2>/dev/null | awk '{print $4}')
  [[ "$addr" =~ ^198\.18\.([0-9]+)\.1/24$ ]] || die "network $1 does not exist (run: $PROG up $1)"
  echo "${BASH_REMATCH[1]}"
}

# ---------------------------------------------------------------------------------------
# up NET [N|auto]
cmd_up() {
  local net=$1 want=${2:-0}
  check_net "$net"
  exec 9>"$LOCK"
  flock 9 # subnets are picked and claimed under one lock, across processes

  if ns_exists "$(router "$net")"; then
    echo "198.18.$(subnet_octet "$net").0/24" # idempotent: already up
    return
  fi

  # The subnet must not be in use by another network (its root veth owns 198.18.N.254).
  local n
  in_use() { ip -4 -o addr show | grep " 198\.18\.$1\.254/" >/dev/null; }
  if [ "$want" = auto ]; then
    for n in $(seq 0 255) none; do
      [ "$n" = none ] && die "no free 198.18.N.0/24 subnet"
      in_use "$n" || break
    done
  else
    [[ "$want" =~ ^[0-9]+$ ]] && [ "$want" -le 255 ] || die "N must be 0-255 or auto"
    n=$want
    in_use "$n" && die "198.18.$n.0/24 is in use by another network"
  fi

  local r h
  r=$(router "$net")
  h=$(hostif "$net")
  ip netns add "$r"
  # The router namespace bridges and never routes.
  ip netns exec "$r" sysctl -qw net.ipv4.ip_forward=0
  ip netns exec "$r" sysctl -qw net.ipv6.conf.all.disable_ipv6=1
  ip netns exec "$r" sysctl -qw net.ipv6.conf.default.disable_ipv6=1
  ip -n "$r" link set lo up
  ip -n "$r" link add br0 type bridge
  ip -n "$r" addr add "198.18.$n.1/24" dev br0
  ip -n "$r" link set br0 up

  # The root namespace's leg: NET-h here, "host" on the bridge.
  ip link add "$h" type veth peer name host netns "$r"
  sysctl -qw "net.ipv6.conf.$h.disable_ipv6=1"
  # Never forward what arrives from the test network (whatever net.ipv4.ip_forward says).
  sysctl -qw "net.ipv4.conf.$h.forwarding=0"
  ip addr add "198.18.$n.254/24" dev "$h"
  ip -n "$r" link set host master br0 up
  ip link set "$h" up
  echo "198.18.$n.0/24"
}

# ---------------------------------------------------------------------------------------
# pod NET NAME IP
cmd_pod() {
  local net=$1 name=$2 ip=$3
  check_net "$net"
  [[ "$name" =~ ^[a-z0-9][a-z0-9-]{0,40}$ ]] || die "pod name must be [a-z0-9-], not '$name'"
  local n r ns host
  n=$(subnet_octet "$net")
  [[ "$ip" =~ ^198\.18\.$n\.([0-9]+)$ ]] || die "$ip is not in $net's subnet 198.18.$n.0/24"
  host=${BASH_REMATCH[1]}
  [ "$host" -ge 2 ] && [ "$host" -le 253 ] || die "pod addresses are 198.18.$n.2-253"
  r=$(router "$net")
  ns="$net-$name"
  ip -n "$r" link show "v$host" >/dev/null 2>&1 && die "$ip is already used in $net"

  ip netns add "$ns"
  # `ip netns exec` mounts /etc/netns/<ns>/* over /etc: a resolver on the pod's own loopback,
  # where nothing listens, so a name lookup fails at once instead of timing out against the
  # host's resolver, which the pod cannot reach. Tests use IP addresses.
  mkdir -p "/etc/netns/$ns"
  echo "nameserver 127.0.0.1" >"/etc/netns/$ns/resolv.conf"
  ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1
  ip netns exec "$ns" sysctl -qw net.ipv6.conf.default.disable_ipv6=1
  ip -n "$ns" link set lo up
  # The veth is created directly in its two namespaces (eth0 in the pod, v<x> on the
  # bridge), so its names never clash with anything in the root namespace.
  ip link add eth0 netns "$ns" type veth peer name "v$host" netns "$r"
  ip -n "$r" link set "v$host" master br0 up
  ip -n "$ns" addr add "$ip/24" dev eth0
  ip -n "$ns" link set eth0 up
  # Only so that connect() to a ClusterIP (198.19.x.x) has a route: the connection is
  # redirected to Envoy in nat OUTPUT, before anything is sent. (Uncaptured traffic to a
  # ClusterIP reaches the router namespace, which drops it.)
  ip -n "$ns" route add default via "198.18.$n.1" dev eth0
}

# ---------------------------------------------------------------------------------------
# attach NET NAME OTHER IP: the pod reaches OTHER's pods (and they it) on OTHER's subnet,
# nothing more: OTHER's pods still have no route to NET's subnet, and the pod does not
# forward between its interfaces (a namespace starts with forwarding off).
cmd_attach() {
  local net=$1 name=$2 other=$3 ip=$4
  check_net "$net"
  check_net "$other"
  local n r ns host
  ns="$net-$name"
  ns_exists "$ns" || die "pod $name does not exist in $net"
  n=$(subnet_octet "$other")
  [[ "$ip" =~ ^198\.18\.$n\.([0-9]+)$ ]] || die "$ip is not in $other's subnet 198.18.$n.0/24"
  host=${BASH_REMATCH[1]}
  [ "$host" -ge 2 ] && [ "$host" -le 253 ] || die "pod addresses are 198.18.$n.2-253"
  r=$(router "$other")
  ip -n "$r" link show "v$host" >/dev/null 2>&1 && die "$ip is already used in $other"
  ip link add eth1 netns "$ns" type veth peer name "v$host" netns "$r"
  ip -n "$r" link set "v$host" master br0 up
  ip -n "$ns" addr add "$ip/24" dev eth1
  ip -n "$ns" link set eth1 up
}

# ---------------------------------------------------------------------------------------
# The iptables backend for pod namespace $1: $SHOAL_IPTABLES if set, else the first of
# iptables-nft and iptables-legacy that can install, in that namespace, a scratch chain with
# the matches and targets the capture needs. nft comes first: Debian's default, and what
# istio-iptables picks when no rules exist yet. Never mix both in one namespace.
pick_iptables() {
  local ns=$1 bin chain="SHOAL_PROBE_$$"
  if [ -n "${SHOAL_IPTABLES:-}" ]; then
    echo "$SHOAL_IPTABLES"
    return
  fi
  for bin in iptables-nft iptables-legacy; do
    command -v "$bin" >/dev/null 2>&1 || continue
    if ip netns exec "$ns" "$bin" -w -t nat -N "$chain" 2>/dev/null; then
      if ip netns exec "$ns" "$bin" -w -t nat -A "$chain" -p tcp ! --dport 15008 \
        -m owner --uid-owner 1337 -j REDIRECT --to-ports 15001 2>/dev/null; then
        ip netns exec "$ns" "$bin" -w -t nat -F "$chain"
        ip netns exec "$ns" "$bin" -w -t nat -X "$chain"
        echo "$bin"
        return
      fi
      ip netns exec "$ns" "$bin" -w -t nat -X "$chain" 2>/dev/null || true
    fi
  done
  die "no working iptables in $ns (install it: apt-get install -y iptables)"
}

# The rules `istio-iptables -p 15001 -z 15006 -u 1337 -g 1337 -m REDIRECT -i '*' -b '*'
# -d 15090,15021,15020` writes (Istio's tools/istio-iptables/pkg/capture/run.go; compare
# testdata/inbound-ports-wildcard.golden), as one iptables-restore input, in Istio's order.
#
# Deviations, all in ISTIO_INBOUND: inbound port 15000 (Envoy's admin) is also excluded, so
# the tests reach every sidecar's admin API at <pod IP>:15000 from the root namespace (Istio
# binds the admin to 127.0.0.1 instead). Extra ports come from `capture -d PORTS`. Istio no
# longer excludes ssh (port 22) by default (istio/istio#36312: VMs pass -d 22); nor do we.
istio_rules() {
  local excludes=$1 port
  cat <<'EOF'
*nat
:ISTIO_INBOUND - [0:0]
:ISTIO_REDIRECT - [0:0]
:ISTIO_IN_REDIRECT - [0:0]
:ISTIO_OUTPUT - [0:0]
# 15008 is the HBONE tunnel port: never captured inbound.
-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN
# Outbound goes to Envoy's virtualOutbound listener, inbound to virtualInbound.
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
# Inbound (-b '*'): all TCP, except the excluded ports.
-A PREROUTING -p tcp -j ISTIO_INBOUND
EOF
  for port in ${excludes//,/ }; do
    echo "-A ISTIO_INBOUND -p tcp --dport $port -j RETURN"
  done
  cat <<'EOF'
-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT
# Outbound (-i '*'): everything the app sends.
-A OUTPUT -j ISTIO_OUTPUT
# Envoy's inbound passthrough connects to the app from 127.0.0.6: not captured again.
-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN
# Envoy (uid 1337) calling its own pod IP over lo (app calls a service that resolves back to
# the same pod: app -> Envoy outbound -> Envoy inbound -> app): send it to inbound.
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
# The app calling its own pod IP directly (app -> app over lo): not captured.
-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN
# Anything else Envoy sends goes out as is (no loops).
-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN
# The same three for gid 1337.
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN
# Calls to localhost are not captured.
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
# Everything else goes to Envoy.
-A ISTIO_OUTPUT -j ISTIO_REDIRECT
COMMIT
EOF
}

# capture NET NAME [-d PORTS]
cmd_capture() {
  local net=$1 name=$2
  shift 2
  local excludes="15090,15021,15020,15000"
  while [ "$#" -gt 0 ]; do
    case $1 in
    -d | --exclude-inbound-ports)
      [ "$#" -ge 2 ] || die "$1 needs a value"
      [[ "$2" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "bad port list '$2'"
      excludes="$excludes,$2"
      shift 2
      ;;
    *) die "capture: unknown option $1" ;;
    esac
  done
  check_net "$net"
  local ns="$net-$name" ipt
  ns_exists "$ns" || die "pod $name does not exist in $net"
  ipt=$(pick_iptables "$ns")
  cmd_uncapture "$net" "$name" "$ipt" # idempotent: replace what a previous run installed
  istio_rules "$excludes" | grep -v '^#' | ip netns exec "$ns" "$ipt-restore" -w --noflush
}

# uncapture NET NAME: removes the jumps into the ISTIO_ chains, then the chains.
cmd_uncapture() {
  local net=$1 name=$2 ipt=${3:-}
  local ns="$net-$name" chain
  ns_exists "$ns" || die "pod $name does not exist in $net"
  [ -n "$ipt" ] || ipt=$(pick_iptables "$ns")
  while ip netns exec "$ns" "$ipt" -w -t nat -D PREROUTING -p tcp -j ISTIO_INBOUND 2>/dev/null; do :; done
  while ip netns exec "$ns" "$ipt" -w -t nat -D OUTPUT -j ISTIO_OUTPUT 2>/dev/null; do :; done
  for chain in ISTIO_INBOUND ISTIO_OUTPUT ISTIO_IN_REDIRECT ISTIO_REDIRECT; do
    ip netns exec "$ns" "$ipt" -w -t nat -F "$chain" 2>/dev/null || true
  done
  for chain in ISTIO_INBOUND ISTIO_OUTPUT ISTIO_IN_REDIRECT ISTIO_REDIRECT; do
    ip netns exec "$ns" "$ipt" -w -t nat -X "$chain" 2>/dev/null || true
  done
}

cmd_iptables() {
  local ns="$1-$2"
  ns_exists "$ns" || die "pod $2 does not exist in $1"
  local ipt
  ipt=$(pick_iptables "$ns")
  ip netns exec "$ns" "$ipt-save" -t nat
}

# ---------------------------------------------------------------------------------------
# exec NET NAME [--uid UID --gid GID] -- CMD...
cmd_exec() {
  local net=$1 name=$2 uid="" gid=""
  shift 2
  while [ "$#" -gt 0 ]; do
    case $1 in
    --uid) uid=$2 && shift 2 ;;
    --gid) gid=$2 && shift 2 ;;
    --) shift && break ;;
    *) break ;;
    esac
  done
  [ "$#" -gt 0 ] || die "exec: no command"
  local ns="$net-$name"
  if [ -n "$uid$gid" ]; then
    # setpriv switches ids with no capabilities left, like a container's non-root user.
    exec ip netns exec "$ns" setpriv --reuid "${uid:-0}" --regid "${gid:-${uid:-0}}" \
      --clear-groups -- "$@"
  fi
  exec ip netns exec "$ns" "$@"
}

# ---------------------------------------------------------------------------------------
# down NET: every step tolerates what is missing, so half-created networks go too.
cmd_down() {
  local net=$1 ns pid
  check_net "$net"
  for ns in $(ip netns list | awk '{print $1}' | grep "^$net-" || true); do
    # Processes keep a namespace alive after its name is gone: stop ours first.
    for pid in $(ip netns pids "$ns" 2>/dev/null || true); do
      kill -KILL "$pid" 2>/dev/null || true
    done
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "/etc/netns/$net-"*
  ip link del "$(hostif "$net")" 2>/dev/null || true
}

cmd_list() {
  ip netns list | awk '{print $1}' | sed -n 's/-router$//p'
}

if [ "$#" -lt 1 ]; then die "usage: see the header of $0"; fi
if [ "$(id -u)" -ne 0 ]; then die "must run as root (network namespaces, iptables)"; fi
sub=$1
shift
usage() { die "usage: $PROG $sub $1"; }
case $sub in
up) if [ "$#" -lt 1 ]; then usage "NET [N|auto]"; fi; cmd_up "$@" ;;
pod) if [ "$#" -ne 3 ]; then usage "NET NAME IP"; fi; cmd_pod "$@" ;;
attach) if [ "$#" -ne 4 ]; then usage "NET NAME OTHER IP"; fi; cmd_attach "$@" ;;
capture) if [ "$#" -lt 2 ]; then usage "NET NAME [-d PORTS]"; fi; cmd_capture "$@" ;;
uncapture) if [ "$#" -ne 2 ]; then usage "NET NAME"; fi; cmd_uncapture "$@" ;;
iptables) if [ "$#" -ne 2 ]; then usage "NET NAME"; fi; cmd_iptables "$@" ;;
exec) if [ "$#" -lt 3 ]; then usage "NET NAME [--uid UID --gid GID] -- CMD..."; fi; cmd_exec "$@" ;;
down) if [ "$#" -ne 1 ]; then usage "NET"; fi; cmd_down "$@" ;;
list) cmd_list ;;
*) die "unknown command '$sub'" ;;
esac
