#!/bin/sh
# ssh/rsh replacement for MPICH hydra on "hosts" that are network namespaces.
#
#   mpiexec -launcher rsh -launcher-exec /path/netns_exec.sh -hosts jc-h0-..,jc-h1-.. ...
#
# hydra calls:  netns_exec.sh [rsh/ssh-style options] <host> <command...>
# and we run   ip netns exec <namespace-of-host> /bin/sh -c "<command...>"
# (like ssh/rsh, the command words are joined and run by a shell).
#
# host -> namespace: JC_NETNS_MAP="host=ns,addr=ns,..." (NetnsCluster.netns_map()),
# otherwise the host name itself must be a namespace name (NetnsCluster uses
# host name == namespace name).  Set JC_NETNS_EXEC_LOG=/file to log invocations.
set -eu

# Skip option words an ssh/rsh-style caller may put before the host (e.g. -x, -q).
while [ $# -gt 0 ]; do
    case "$1" in
        -l|-p|-o|-i|-F) shift 2 ;;
        -*) shift ;;
        *) break ;;
    esac
done
if [ $# -lt 2 ]; then
    echo "usage: $0 <host> <command...>" >&2
    exit 255
fi
host=$1
shift

ns=""
if [ -n "${JC_NETNS_MAP:-}" ]; then
    old_ifs=$IFS
    IFS=,
    for kv in $JC_NETNS_MAP; do
        if [ "${kv%%=*}" = "$host" ]; then
            ns=${kv#*=}
            break
        fi
    done
    IFS=$old_ifs
fi
[ -n "$ns" ] || ns=$host
if [ ! -e "/run/netns/$ns" ]; then
    echo "netns_exec.sh: no network namespace for host '$host' ('$ns')" >&2
    exit 255
fi
if [ -n "${JC_NETNS_EXEC_LOG:-}" ]; then
    printf '%s host=%s ns=%s cmd=%s\n' "$(date +%T.%N)" "$host" "$ns" "$*" >>"$JC_NETNS_EXEC_LOG"
fi
exec ip netns exec "$ns" /bin/sh -c "exec $*"
