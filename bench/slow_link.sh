#!/bin/sh
# A slow link on one machine, for trying a cluster across it (needs root; Linux).
#
#   sudo sh bench/slow_link.sh up [RATE]   # namespace "slowns", veth 10.9.0.1 <-> 10.9.0.2,
#                                          # RATE each way (default 100mbit, tc tbf syntax)
#   sudo sh bench/slow_link.sh down        # removes the namespace and the veth pair
#
# Then a manager and a worker on the host side, and a worker behind the link:
#
#   actorpy secret --out s.secret
#   actorpy manager --bind tcp://10.9.0.1:7500 --secret-file s.secret &
#   actorpy worker --manager tcp://10.9.0.1:7500 --secret-file s.secret --host 10.9.0.1 &
#   sudo ip netns exec slowns actorpy worker --manager tcp://10.9.0.1:7500 \
#       --secret-file s.secret --host 10.9.0.2 &
#
# and any app or script with --manager tcp://10.9.0.1:7500 --secret-file s.secret.
# `ip link set vh0 down` (and `up`) cuts the link and mends it. Only the veth pair is
# shaped: loopback and every other interface stay as they were.
set -eu
case "${1:-}" in
up)
    rate="${2:-100mbit}"
    ip netns add slowns
    ip link add vh0 type veth peer name vs0
    ip link set vs0 netns slowns
    ip addr add 10.9.0.1/24 dev vh0
    ip link set vh0 up
    ip netns exec slowns ip addr add 10.9.0.2/24 dev vs0
    ip netns exec slowns ip link set vs0 up
    ip netns exec slowns ip link set lo up
    tc qdisc add dev vh0 root tbf rate "$rate" burst 256kb latency 400ms
    ip netns exec slowns tc qdisc add dev vs0 root tbf rate "$rate" burst 256kb latency 400ms
    echo "slowns: 10.9.0.1 (here) <-> 10.9.0.2 (ip netns exec slowns ...), $rate each way"
    ;;
down)
    ip netns del slowns 2>/dev/null || true
    ip link del vh0 2>/dev/null || true
    ;;
*)
    echo "usage: $0 up [RATE] | down" >&2
    exit 2
    ;;
esac
