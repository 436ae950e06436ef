#!/bin/bash
# Throwaway PostgreSQL server for tests.
#
#   pg.sh start DIR PORT [DB]   initdb (first time) + start + create DB (default: floe);
#                               prints the connection URL on stdout
#   pg.sh stop DIR              fast shutdown (no error if not running)
#   pg.sh status DIR            exit 0 if running
#   pg.sh url DIR [DB]          print postgresql://floe@127.0.0.1:PORT/DB
#
# Superuser "floe", no password (-A trust), TCP on 127.0.0.1:PORT only, unix socket in DIR.
# Durability is switched off (fsync/synchronous_commit/full_page_writes=off): tests only.
# Works as root: initdb refuses to run as root, so the server runs as the "postgres" system
# user (created by Debian's postgresql package) via runuser, and DIR is chowned to it.
# Ancestors of DIR under $TMPDIR or /tmp that the postgres user cannot search (0700 temp
# dirs) get o+x; elsewhere that needs PG_SH_FIX_PARENTS=1, else pg.sh stops with a message.
# As a non-root user it runs as that user.
# Binaries: $PGBIN, else the newest /usr/lib/postgresql/*/bin (Debian: apt-get install -y postgresql-15).
# DIR/.s.PGSQL.PORT must stay under 107 bytes (unix socket path limit).
set -euo pipefail

die() { echo "pg.sh: $*" >&2; exit 1; }

find_pgbin() {
  if [ -n "${PGBIN:-}" ]; then echo "$PGBIN"; return; fi
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
  [ -n "$d" ] && [ -x "$d/initdb" ] || die "no PostgreSQL binaries (set PGBIN or: apt-get install -y postgresql-15)"
  echo "$d"
}

# run a command as the server's user
as_pg() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u "${PG_OS_USER:-postgres}" -- env LC_ALL=C.UTF-8 "$@"
  else
    env LC_ALL=C.UTF-8 "$@"
  fi
}

cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || die "usage: pg.sh start DIR PORT [DB] | stop DIR | status DIR | url DIR [DB]"
PGBIN=$(find_pgbin)
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
data="$dir/data"

case "$cmd" in
start)
  port=${3:-}; db=${4:-floe}
  [ -n "$port" ] || die "usage: pg.sh start DIR PORT [DB]"
  [ ${#dir} -lt 90 ] || die "DIR path too long for a unix socket: $dir"
  if [ "$(id -u)" = 0 ]; then
    id "${PG_OS_USER:-postgres}" >/dev/null 2>&1 || die "no '${PG_OS_USER:-postgres}' user (install postgresql, or set PG_OS_USER)"
    chown -R "${PG_OS_USER:-postgres}:" "$dir"
    # Temp dirs (mktemp -d, Rust's tempfile) are 0700 root: give the server user search (x)
    # permission on such ancestors under $TMPDIR or /tmp (or everywhere with PG_SH_FIX_PARENTS=1).
    tmproot=$(cd "${TMPDIR:-/tmp}" && pwd)
    p=$(dirname "$dir")
    while [ "$p" != / ]; do
      if ! runuser -u "${PG_OS_USER:-postgres}" -- test -x "$p"; then
        case "$p/" in
          "$tmproot"/*|/tmp/*) chmod o+x "$p" ;;
          *) [ "${PG_SH_FIX_PARENTS:-0}" = 1 ] && chmod o+x "$p" ;;
        esac
      fi
      p=$(dirname "$p")
    done
    runuser -u "${PG_OS_USER:-postgres}" -- test -w "$dir" || die "user ${PG_OS_USER:-postgres} cannot write $dir (a parent directory is not searchable?)"
  fi
  if [ ! -f "$data/PG_VERSION" ]; then
    as_pg "$PGBIN/initdb" -D "$data" -A trust -U floe -E UTF8 --no-sync --no-instructions >"$dir/initdb.log" 2>&1 \
      || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
    cat >>"$data/postgresql.conf" <<EOF
# pg.sh test settings
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 100
shared_buffers = 32MB
log_min_messages = warning
EOF
  fi
  if as_pg "$PGBIN/pg_ctl" -D "$data" status >/dev/null 2>&1; then
    die "already running in $dir"
  fi
  as_pg "$PGBIN/pg_ctl" -D "$data" -l "$dir/postgres.log" -o "-p $port" -w -t 30 start >/dev/null \
    || { tail -20 "$dir/postgres.log" >&2; die "start failed"; }
  echo "$port" >"$dir/port"
  if ! as_pg "$PGBIN/psql" -h "$dir" -p "$port" -U floe -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname='$db'" | grep -q 1; then
    as_pg "$PGBIN/createdb" -h "$dir" -p "$port" -U floe "$db"
  fi
  echo "postgresql://floe@127.0.0.1:$port/$db"
  ;;
stop)
  if [ -f "$data/PG_VERSION" ] && as_pg "$PGBIN/pg_ctl" -D "$data" status >/dev/null 2>&1; then
    as_pg "$PGBIN/pg_ctl" -D "$data" -m fast -w -t 30 stop >/dev/null
  fi
  ;;
status)
  as_pg "$PGBIN/pg_ctl" -D "$data" status >/dev/null 2>&1
  ;;
url)
  [ -f "$dir/port" ] || die "not started: $dir"
  echo "postgresql://floe@127.0.0.1:$(cat "$dir/port")/${3:-floe}"
  ;;
*)
  die "unknown command $cmd"
  ;;
esac
