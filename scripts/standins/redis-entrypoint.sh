#!/bin/sh
# The stand-in redis image's entrypoint (redis.Containerfile): redis-server as the `redis` user,
# without protected mode (the official image compiles it off).
set -eu
if [ "${1:-}" = redis-server ]; then
  shift
  set -- redis-server --protected-mode no "$@"
  if [ "$(id -u)" = 0 ]; then
    chown redis:redis /data
    exec setpriv --reuid=redis --regid=redis --init-groups "$@"
  fi
fi
exec "$@"
