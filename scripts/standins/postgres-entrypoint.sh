#!/usr/bin/env bash
# The stand-in postgres image's entrypoint (postgres.Containerfile): the first start of an empty
# PGDATA runs initdb with POSTGRES_USER and POSTGRES_PASSWORD and creates POSTGRES_DB, as the official
# image does; every start then runs the server as the `postgres` user.
set -euo pipefail

if [ "${1:-}" != postgres ]; then
  exec "$@"
fi
if [ "$(id -u)" = 0 ]; then  # a fresh volume may be root's: hand it over, then run as postgres
  mkdir -p "$PGDATA"
  chown postgres:postgres "$PGDATA"
  chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
    POSTGRES_PASSWORD=$(<"$POSTGRES_PASSWORD_FILE")
  fi
  if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "error: the database is uninitialised and POSTGRES_PASSWORD is not set (nor POSTGRES_PASSWORD_FILE)" >&2
    exit 1
  fi
  user=${POSTGRES_USER:-postgres}
  db=${POSTGRES_DB:-$user}
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  initdb --username="$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
    --encoding=UTF8 --locale=C.UTF-8 -D "$PGDATA" >/dev/null
  rm -f "$pwfile"
  printf '\n# any address, with the password (the compose network)\nhost all all all scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
  if [ "$db" != postgres ]; then
    # On the socket only while the database is made, so that nothing counts it as ready yet.
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    psql -v ON_ERROR_STOP=1 -q --username="$user" --dbname=postgres -v db="$db" <<<'CREATE DATABASE :"db";'
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  fi
  echo "initialised $PGDATA: user $user, database $db"
fi
exec "$@"
