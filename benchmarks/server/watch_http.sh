#!/usr/bin/env bash
# Beside a serving run on the same host: sample what a server's requests meet before its scheduler,
# until stopped (SIGTERM) or STOP_AFTER seconds.
#
#   bash benchmarks/server/watch_http.sh PORT DIR &
#
# DIR/listen.tsv: every 20 ms, the epoch time, the length of PORT's listen queue (connections the
# kernel accepted that the server's process has not taken yet; from /proc/net/tcp) and the host's
# TcpExt ListenOverflows counter (connections dropped because a listen queue was full). DIR/host.txt:
# the host's limits on listen queues (net.core.somaxconn, net.ipv4.tcp_max_syn_backlog, syncookies),
# its open-file limit and kernel. DIR/http-stacks.txt: with py-spy on PATH, every 100 ms a dump of
# the Python stacks of the process that serves PORT's HTTP (the launcher's process: a command line
# with "launch_server" and "--port PORT"), each under a line "== <epoch time> pid <pid>".
set -u
port=${1:?usage: watch_http.sh PORT DIR}
out=${2:?usage: watch_http.sh PORT DIR}
mkdir -p "$out"
hexport=$(printf ':%04X' "$port")
{
    for f in net/core/somaxconn net/ipv4/tcp_max_syn_backlog net/ipv4/tcp_syncookies; do
        echo "$f $(cat "/proc/sys/$f" 2>/dev/null || echo unknown)"
    done
    echo "ulimit -n $(ulimit -n)"
    echo "kernel $(uname -r)"
} > "$out/host.txt"

overflows() {
    awk '/^TcpExt:/ { if (!col) { for (i = 2; i <= NF; i++) if ($i == "ListenOverflows") col = i; next }
                      print $col; exit }' /proc/net/netstat
}

queue() {
    # field 4 is the state (0A: listening), field 5 "tx_queue:rx_queue" in hex: rx is the accept queue
    local hex
    hex=$(awk -v p="$hexport" '$4 == "0A" && substr($2, length($2) - 4) == p { split($5, q, ":"); print q[2]; exit }' \
              /proc/net/tcp /proc/net/tcp6)
    [ -n "$hex" ] && echo $((16#$hex)) || echo -
}

server_pid() {
    local d
    for d in /proc/[0-9]*; do
        tr '\0' ' ' 2> /dev/null < "$d/cmdline" | grep -q -- "launch_server.* --port $port " && { echo "${d#/proc/}"; return; }
    done
}

end=$(( $(date +%s) + ${STOP_AFTER:-3600} ))
(
    while [ "$(date +%s)" -lt "$end" ]; do
        echo "$(date +%s.%N) $(queue) $(overflows)"
        sleep 0.02
    done > "$out/listen.tsv"
) &
if command -v py-spy > /dev/null; then
    (
        pid=
        while [ "$(date +%s)" -lt "$end" ]; do
            if [ -z "$pid" ] || [ ! -d "/proc/$pid" ]; then
                pid=$(server_pid)
                [ -z "$pid" ] && { sleep 0.5; continue; }
            fi
            echo "== $(date +%s.%N) pid $pid"
            py-spy dump --nonblocking --pid "$pid" 2>&1
            sleep 0.1
        done > "$out/http-stacks.txt"
    ) &
fi
trap 'kill $(jobs -p) 2> /dev/null; exit 0' TERM INT
wait
