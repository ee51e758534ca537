#!/usr/bin/env bash
# Build deploy/Dockerfile with podman and run it the way users do; then bring up
# deploy/docker-compose.yml (PostgreSQL, Redis, two gateways behind haproxy, Prometheus) and hold a
# stored multi-turn Responses conversation whose turns cross both gateways, check that Prometheus
# scrapes both, then kill -9 one gateway and continue the conversation on the other.
#
#   scripts/container_smoke.sh [image|compose|all]      (default: all; CI runs it, so can you)
#
# Where no registry is reachable (these build machines), the base images are made locally:
# Debian bookworm by debootstrap (python3, pip, venv), tagged with the name the Dockerfile's FROM
# uses, and Prometheus, PostgreSQL, Redis and haproxy images from Debian's packages over the same
# base (scripts/standins/), tagged with the compose file's image names. Grafana is not installable here and is not
# started (its dashboards' PromQL is tested against real Prometheus by the test suite).
# Everything is cached: base images are made once, podman keeps its build cache, so a second
# run rebuilds nothing unless the sources changed.
#
# A machine that cannot run containers prints "SKIP container smoke: <why>" and exits 0
# (ENGINEGATE_REQUIRE_CONTAINERS=1 turns a skip into a failure); anything else that goes wrong
# exits non-zero with the container's log.
set -euo pipefail
cd "$(dirname "$0")/.."

WHAT="${1:-all}"
CACHE="${ENGINEGATE_CACHE:-$HOME/.cache/enginegate}"
IMAGE="${ENGINEGATE_IMAGE:-localhost/enginegate:cpu}"
BASE="localhost/debian-bookworm-py:local"
PROJECT="enginegate-smoke"
READY_TIMEOUT_S="${READY_TIMEOUT_S:-300}"
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo -n"

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }
skip() {
  echo "SKIP container smoke: $*"
  [ "${ENGINEGATE_REQUIRE_CONTAINERS:-0}" = 1 ] && exit 1
  exit 0
}
timed() {  # timed LABEL CMD...: run CMD and say how long it took
  local label=$1 start=$SECONDS; shift
  "$@"
  say "$label: $((SECONDS - start)) s"
}
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# The name deploy/Dockerfile's FROM resolves to (its PYTHON_IMAGE default) and compose's Prometheus image.
from_image() { awk -F= '/^ARG PYTHON_IMAGE=/{print $2; exit}' deploy/Dockerfile; }
compose_image() { python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["services"][sys.argv[2]]["image"])' deploy/docker-compose.yml "$1"; }

ensure_tools() {
  local missing=() tool
  for tool in podman runc debootstrap podman-compose; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  # CNI networks resolve container names (compose's "gateway:8000") only with the dnsname plugin.
  [ -e /usr/lib/cni/dnsname ] || missing+=(golang-github-containernetworking-plugin-dnsname)
  if [ "${#missing[@]}" -gt 0 ]; then
    command -v apt-get >/dev/null || skip "no apt-get to install ${missing[*]}; install them yourself"
    [ -z "$SUDO" ] || $SUDO true 2>/dev/null || skip "not root and no password-less sudo to install ${missing[*]}"
    say "installing ${missing[*]} from Debian"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  # crun refuses hybrid-cgroup VMs like these; their default rlimits are not permitted either.
  if [ ! -e /etc/containers/containers.conf ]; then
    say "writing /etc/containers/containers.conf (runc, cgroupfs, explicit ulimits)"
    $SUDO mkdir -p /etc/containers
    printf '%s\n' '[containers]' 'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]' \
      '[engine]' 'runtime = "runc"' 'cgroup_manager = "cgroupfs"' | $SUDO tee /etc/containers/containers.conf >/dev/null
  fi
  podman info >/dev/null 2>&1 || skip "podman cannot run here: $(podman info 2>&1 | tail -1)"
}

ensure_base() {
  if ! podman image exists "$BASE"; then
    local mirror rootfs
    mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    rootfs=$(mktemp -d /var/tmp/enginegate-rootfs.XXXXXX)
    say "making $BASE with debootstrap from ${mirror:-http://deb.debian.org/debian}"
    $SUDO debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates \
      bookworm "$rootfs" "${mirror:-http://deb.debian.org/debian}" >/dev/null
    $SUDO tar -C "$rootfs" -c . | podman import - "$BASE" >/dev/null
    $SUDO rm -rf "$rootfs"
  fi
  podman run --rm "$BASE" true 2>/dev/null || skip "podman cannot start a container here: $(podman run --rm "$BASE" true 2>&1 | tail -1)"
  local python_image work
  python_image=$(from_image)
  if ! podman image exists "$python_image"; then
    # Debian's Python 3.11 standing in for the official image: pip may install system-wide (as in
    # the official image), and trusts this host's CA bundle (the way out may re-sign TLS). The
    # bundle gets a path of its own so apt's update-ca-certificates cannot overwrite it.
    say "tagging a stand-in for $python_image (Debian bookworm's python3)"
    work=$(mktemp -d)
    cp /etc/ssl/certs/ca-certificates.crt "$work/host-ca.crt"
    printf '%s\n' "FROM $BASE" 'COPY host-ca.crt /etc/ssl/host-ca.crt' \
      'ENV SSL_CERT_FILE=/etc/ssl/host-ca.crt PIP_CERT=/etc/ssl/host-ca.crt' \
      'RUN rm -f /usr/lib/python3*/EXTERNALLY-MANAGED' >"$work/Containerfile"
    podman build -q --format docker -t "localhost/$python_image" "$work" >/dev/null
    rm -rf "$work"
  fi
}

# The llama-cpp-python wheel `make setup` built for this CPU (scripts/bootstrap.sh's cache key), if any.
host_wheel() {
  local version key
  version=$(awk -F= '/^ARG LLAMA_CPP_VERSION=/{print $2; exit}' deploy/Dockerfile)
  key=$(printf '%s' "$(python3 gateway/llamacpp_flags.py)" | sha1sum | cut -c1-12)
  ls "$CACHE/wheels/llamacpp-$version-$key"/llama_cpp_python-"$version"-*.whl 2>/dev/null | head -1
}

build_image() {
  # Reuse the host's wheel so llama.cpp is not compiled a second time inside the image (an image so
  # built is tuned to this CPU, which is all a smoke test needs); ENGINEGATE_IMAGE_PORTABLE=1
  # compiles the portable wheel inside the image instead, as a plain `docker build` does.
  local args=() wheel=""
  [ "${ENGINEGATE_IMAGE_PORTABLE:-0}" = 1 ] || wheel=$(host_wheel)
  if [ -n "$wheel" ]; then
    rm -rf .whl && mkdir -p .whl && cp "$wheel" .whl/   # into the build context (.whl/ is gitignored)
    args=(--build-arg LLAMA_WHEEL_DIR=.whl)
    say "reusing $wheel (make setup's, for this CPU) instead of compiling llama.cpp in the image"
  else
    say "compiling llama.cpp inside the image with the portable flags"
  fi
  say "podman build -f deploy/Dockerfile -> $IMAGE (cached layers are reused)"
  podman build --format docker --pull=never "${args[@]}" -f deploy/Dockerfile -t "$IMAGE" . \
    | grep -E '^(STEP|COMMIT|--> Using cache)|llama-cpp-python: ' || true
  podman image exists "$IMAGE" || { echo "podman build failed" >&2; exit 1; }
}

# wait_ready URL NAME: until URL/ready answers 200, while container NAME runs (bounded).
wait_ready() {
  local url=$1 name=$2 deadline=$((SECONDS + READY_TIMEOUT_S))
  until curl -fs -o /dev/null "$url/ready"; do
    if [ "$(podman inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" != true ] || [ $SECONDS -ge $deadline ]; then
      echo "container $name is not ready at $url/ready; its log:" >&2
      podman logs --tail 60 "$name" >&2 || true
      return 1
    fi
    sleep 2
  done
}

client_python() {  # an interpreter with the official openai client
  local venv="$CACHE/venvs/smoke-client"
  if ! "$venv/bin/python" -c 'import openai, httpx' 2>/dev/null; then
    python3 -m venv "$venv" >&2
    "$venv/bin/python" -m pip install -q "openai>=1.40" "httpx>=0.27" >&2
  fi
  echo "$venv/bin/python"
}

run_image() {  # run_image LABEL PODMAN_RUN_ARGS...: run the image, serve one chat completion, stop it
  local label=$1 port name="$PROJECT-$1"; shift
  port=$(free_port)
  podman rm -f "$name" >/dev/null 2>&1 || true
  # Without systemd podman cannot arm the health-check timer and says so (harmless; filtered out):
  # `podman healthcheck run` below runs the image's check once instead.
  podman run -d --name "$name" -p "127.0.0.1:$port:8000" "$@" "$IMAGE" 2> >(grep -v 'systemd connection' >&2) >/dev/null
  local ok=0
  if wait_ready "http://127.0.0.1:$port" "$name" && "$PY" scripts/smoke_client.py "http://127.0.0.1:$port"; then
    podman healthcheck run "$name" >/dev/null 2>&1 && say "$label: image HEALTHCHECK passes" || { echo "HEALTHCHECK fails" >&2; ok=1; }
  else
    ok=1
  fi
  [ $ok -eq 0 ] || podman logs --tail 40 "$name" >&2 || true
  podman rm -f "$name" 2>/dev/null >/dev/null
  return $ok
}

smoke_image() {
  timed "image built" build_image
  timed "image served (plain run)" run_image plain
  # Locked down: nothing writable but tmpfs where the gateway writes (HF cache, logs, temp files). The
  # response and key stores go under /tmp: podman here mounts the other tmpfs root-owned 0755 whatever
  # mode= says, and the gateway now checks its response store at start-up (it fails in one line if it cannot write).
  timed "image served (read-only, no capabilities)" run_image readonly --read-only --cap-drop ALL \
    --security-opt no-new-privileges --tmpfs /tmp --tmpfs /data:rw,mode=1777 --tmpfs /home/enginegate:rw,mode=1777 \
    -e XDG_DATA_HOME=/tmp/enginegate-data
}

ensure_prometheus_image() {
  local name work
  name=$(compose_image prometheus)
  podman image exists "$name" && return
  say "building a stand-in for $name from Debian's prometheus package"
  work=$(mktemp -d)
  printf '%s\n' "FROM $BASE" \
    'RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \' \
    ' && rm -rf /var/lib/apt/lists/* && mkdir -p /prometheus && chown nobody:nogroup /prometheus' \
    'USER nobody' 'WORKDIR /prometheus' 'ENTRYPOINT ["/usr/bin/prometheus"]' >"$work/Containerfile"
  podman build -q --format docker -t "localhost/$name" "$work" >/dev/null
  rm -rf "$work"
}

# Stand-ins for the official postgres, redis and haproxy images, from Debian's packages over the same
# base (scripts/standins/*.Containerfile say what each keeps of the official image's behaviour), tagged
# with the names the compose file uses. Built every run: podman's layer cache makes that a no-op
# unless a Containerfile or entrypoint changed.
ensure_service_images() {
  local svc name
  for svc in postgres redis haproxy; do
    name=$(compose_image "$svc")
    podman build -q --format docker --pull=never --build-arg BASE="$BASE" -t "localhost/$name" \
      -f "scripts/standins/$svc.Containerfile" scripts/standins >/dev/null \
      || { echo "building the stand-in $name failed" >&2; return 1; }
  done
}

# wait_healthy NAME: until the container's own health check (the compose file's) passes, bounded.
# podman-compose 1.0.3 ignores depends_on conditions, and podman runs health checks only from
# systemd timers, absent here: the check is run here instead, as `condition: service_healthy` would.
wait_healthy() {
  local name=$1 deadline=$((SECONDS + 120))
  until podman healthcheck run "$name" >/dev/null 2>&1; do
    if [ "$(podman inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" != true ] || [ $SECONDS -ge $deadline ]; then
      echo "container $name is not healthy; its log:" >&2
      podman logs --tail 40 "$name" >&2 || true
      return 1
    fi
    sleep 1
  done
}

COMPOSE_SERVICES=(postgres redis gateway-a gateway-b haproxy prometheus)

smoke_compose() {
  ensure_prometheus_image
  ensure_service_images
  podman image exists "$IMAGE" || build_image
  export ENGINEGATE_PORT PROMETHEUS_PORT POSTGRES_PASSWORD REDIS_PASSWORD
  ENGINEGATE_PORT=$(free_port); PROMETHEUS_PORT=$(free_port)
  POSTGRES_PASSWORD=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
  REDIS_PASSWORD=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
  local compose=(podman-compose -p "$PROJECT" -f deploy/docker-compose.yml)
  "${compose[@]}" down -v >/dev/null 2>&1 || true
  say "compose up: PostgreSQL, Redis, gateway-a and gateway-b behind haproxy on :$ENGINEGATE_PORT, Prometheus on :$PROMETHEUS_PORT (Grafana is not installable here)"
  local ok=0 lb="http://127.0.0.1:$ENGINEGATE_PORT" prom="http://127.0.0.1:$PROMETHEUS_PORT" state
  state=$(mktemp)
  # The database and Redis first, healthy, as depends_on's conditions ask; then the rest at once: both
  # gateways start together against the empty database (one migrates it, the other waits).
  "${compose[@]}" up -d postgres redis >/dev/null
  if wait_healthy "${PROJECT}_postgres_1" && wait_healthy "${PROJECT}_redis_1"; then
    "${compose[@]}" up -d "${COMPOSE_SERVICES[@]}" >/dev/null
  else
    ok=1
  fi
  if [ $ok -eq 0 ] && wait_healthy "${PROJECT}_gateway-a_1" && wait_healthy "${PROJECT}_gateway-b_1" \
     && wait_ready "$lb" "${PROJECT}_haproxy_1" && "$PY" scripts/smoke_client.py "$lb" \
     && "$PY" scripts/smoke_conversation.py "$lb" start "$state"; then
    # Prometheus reaches each gateway by its service name and scrapes the requests just made: both
    # targets up, and each gateway counted Responses requests (the conversation crossed them).
    "$PY" - "$prom" <<'PY' || ok=1
import sys, time, httpx
prom, deadline = sys.argv[1], time.monotonic() + 120
def query(q):
    return httpx.get(prom + "/api/v1/query", params={"query": q}, timeout=5).json()["data"]["result"]
while True:
    try:
        up = {r["metric"]["instance"]: r["value"][1] for r in query('up{job="enginegate"}')}
        served = {r["metric"]["instance"]: float(r["value"][1]) for r in query(
            'sum by (instance) (enginegate_requests_total{route=~"/v1/responses.*",status="200"})')}
        chats = query('sum(enginegate_requests_total{route="/v1/chat/completions",status="200"})')
        if up == {"gateway-a:8000": "1", "gateway-b:8000": "1"} and len(served) == 2 and min(served.values()) >= 1 \
                and chats and float(chats[0]["value"][1]) >= 1:
            print(f"prometheus: both targets up; Responses requests per gateway {served}; "
                  f"{chats[0]['value'][1]} chat completion(s) scraped")
            break
    except (httpx.HTTPError, KeyError, ValueError):
        pass
    if time.monotonic() > deadline:
        targets = httpx.get(prom + "/api/v1/targets", timeout=5).text
        sys.exit(f"Prometheus did not scrape both gateways within 120 s: {targets[:1500]}")
    time.sleep(2)
PY
    # kill -9 one gateway between two turns: the next turns go to the other one (haproxy redispatches
    # a refused connection, then its health check takes the dead one out) and continue the conversation.
    if [ $ok -eq 0 ]; then
      podman kill -s KILL "${PROJECT}_gateway-a_1" >/dev/null
      "$PY" scripts/smoke_conversation.py "$lb" continue "$state" || ok=1
    fi
  else
    ok=1
  fi
  if [ $ok -ne 0 ]; then
    for svc in "${COMPOSE_SERVICES[@]}"; do
      echo "--- ${PROJECT}_${svc}_1" >&2; podman logs --tail 40 "${PROJECT}_${svc}_1" >&2 || true
    done
  fi
  rm -f "$state"
  "${compose[@]}" down -v >/dev/null 2>&1 || true
  return $ok
}

total=$SECONDS
timed "tools" ensure_tools
timed "base images" ensure_base
PY=$(client_python)
case "$WHAT" in
  image) smoke_image ;;
  compose) timed "compose (PostgreSQL, Redis, 2 gateways, haproxy, Prometheus)" smoke_compose ;;
  all) smoke_image; timed "compose (PostgreSQL, Redis, 2 gateways, haproxy, Prometheus)" smoke_compose ;;
  *) echo "usage: $0 [image|compose|all]" >&2; exit 2 ;;
esac
say "container smoke passed in $((SECONDS - total)) s"
