#!/usr/bin/env bash
# Run a throwaway Kafka-protocol broker (Tansu, in-memory storage) on loopback.
#
#   scripts/broker.sh start PORT DIR   start on 127.0.0.1:PORT; log DIR/broker.log, pid DIR/broker.pid;
#                                      returns once the port accepts TCP connections (max 20 s)
#   scripts/broker.sh stop DIR         stop the broker whose pid is in DIR/broker.pid and wait for it
#
# Needs scripts/setup.sh to have run (uses scripts/env.sh for FLOE_TANSU).
# Several brokers may run at once on different ports with different DIRs.
# State is in memory only: a stopped broker forgets all topics and offsets.
set -euo pipefail

script_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"

die() { echo "broker.sh: $*" >&2; exit 1; }
usage() { die "usage: broker.sh start PORT DIR | stop DIR"; }

# True if something accepts TCP connections on 127.0.0.1:$1.
port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# True if pid $1 is alive and is a tansu process.
is_tansu() {
    local pid="$1" exe
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    exe="$(readlink "/proc/$pid/exe" 2>/dev/null || true)"
    [[ "$exe" == */tansu* ]]
}

start() {
    local port="$1" dir="$2"
    [[ "$port" =~ ^[0-9]+$ && "$port" -ge 1 && "$port" -le 65535 ]] || die "bad port: $port"
    mkdir -p -- "$dir" || die "cannot create $dir"
    dir="$(cd -- "$dir" && pwd)"
    local pidfile="$dir/broker.pid" log="$dir/broker.log"

    if [[ -f "$pidfile" ]]; then
        local old
        old="$(cat "$pidfile" 2>/dev/null || true)"
        if is_tansu "$old"; then
            die "a broker is already running from $dir (pid $old); stop it first"
        fi
        rm -f -- "$pidfile"
    fi
    if port_open "$port"; then
        die "127.0.0.1:$port is already in use"
    fi

    # shellcheck source=scripts/env.sh
    source "$script_dir/env.sh" || die "environment not set up (run scripts/setup.sh)"

    local url="tcp://127.0.0.1:$port"
    # Tansu also reads its settings from these variables; keep the caller's
    # environment from changing the broker (e.g. sending telemetry somewhere).
    (
        cd "$dir"
        unset CLUSTER_ID LISTENER_URL ADVERTISED_LISTENER_URL STORAGE_ENGINE SCHEMA_REGISTRY \
              OTEL_EXPORTER_OTLP_ENDPOINT
        exec "$FLOE_TANSU" broker \
            --cluster-id "floe-$port" \
            --listener-url "$url" \
            --advertised-listener-url "$url" \
            --storage-engine "memory://tansu/" \
            </dev/null >"$log" 2>&1
    ) &
    local pid=$!
    echo "$pid" >"$pidfile"

    local deadline=$((SECONDS + 20))
    while :; do
        if ! kill -0 "$pid" 2>/dev/null; then
            rm -f -- "$pidfile"
            echo "broker.sh: tansu exited during startup on port $port; last log lines ($log):" >&2
            tail -n 30 "$log" >&2 || true
            exit 1
        fi
        if port_open "$port"; then
            break
        fi
        if ((SECONDS >= deadline)); then
            kill -KILL "$pid" 2>/dev/null || true
            rm -f -- "$pidfile"
            echo "broker.sh: tansu did not accept connections on 127.0.0.1:$port within 20 s; last log lines ($log):" >&2
            tail -n 30 "$log" >&2 || true
            exit 1
        fi
        sleep 0.1
    done
    echo "broker started: 127.0.0.1:$port pid $pid log $log"
}

stop() {
    local dir="$1" pidfile pid
    pidfile="$dir/broker.pid"
    if [[ ! -f "$pidfile" ]]; then
        echo "broker.sh: no $pidfile; nothing to stop" >&2
        return 0
    fi
    pid="$(cat "$pidfile" 2>/dev/null || true)"
    if ! is_tansu "$pid"; then
        rm -f -- "$pidfile"
        echo "broker.sh: broker from $dir (pid ${pid:-?}) was not running" >&2
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 10))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null || true
        deadline=$((SECONDS + 5))
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
            sleep 0.1
        done
        kill -0 "$pid" 2>/dev/null && die "could not stop broker pid $pid"
    fi
    rm -f -- "$pidfile"
    echo "broker stopped: pid $pid"
}

case "${1:-}" in
    start) [[ $# -eq 3 ]] || usage; start "$2" "$3" ;;
    stop)  [[ $# -eq 2 ]] || usage; stop "$2" ;;
    *) usage ;;
esac
