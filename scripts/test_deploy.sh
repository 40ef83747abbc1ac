#!/usr/bin/env bash
# `make test-deploy`: the compose deployment, built and run as a user would, end to end.
#
#  1. podman set up for this kind of machine (scripts/deploy/setup.sh; apt-get, once);
#  2. stand-ins for the base images, cached (scripts/deploy/bases.sh; about 3 min once);
#  3. the coordinator, CPU worker and client images built from docker/ with --pull=never;
#  4. docker-compose.yml up with tests/deploy/compose.test.yml (host networking, loopback
#     ports picked free), init first: signing key, token, CA and TLS, Redis ACL users;
#  5. checks, each bounded in time:
#     - `torchfarm status` through the farm (token, TLS) lists the worker;
#     - client A, a container of its own, trains the GPT example through the farm with
#       its token, the CA and the pinned key; every graph compiled by the farm, no
#       warning about trust;
#     - client B, a fresh container, gets every graph as a cache hit (no local compile);
#     - client C starts a cold compile; the worker container is stopped in the middle
#       of it (SIGTERM, then SIGKILL after 2 s) and started again; C gets its artifact;
#  6. everything torn down (volumes too); wall time and image sizes printed.
# Exit status 0 when every check passed. TORCHFARM_DEPLOY_KEEP=1 leaves the stack up.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
START=$SECONDS
PROJECT=${TORCHFARM_DEPLOY_PROJECT:-tfdeploy}
CACHE=${TORCHFARM_DEPLOY_CACHE:-/var/cache/torchfarm-deploy}
WORK=$(mktemp -d /tmp/torchfarm-deploy.XXXXXX)
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
CLIENT_IMAGE=localhost/torchfarm/client:$VERSION
MODEL=${TORCHFARM_DEPLOY_MODEL:-gpt}
export TORCHFARM_DEPLOY_CACHE=$CACHE BUILD_LOG_DIR=$WORK

say() { echo "test-deploy [$((SECONDS - START)) s] $*" >&2; }
fail() { say "FAILED: $*"; exit 1; }

# Waits up to $1 seconds for the command after it to succeed.
wait_until() {
  local limit=$1; shift
  local until=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $until ] || return 1
    sleep 2
  done
}

say "set-up"
./scripts/deploy/setup.sh
./scripts/deploy/bases.sh

# podman-compose from PyPI, pinned, in a venv of its own: Debian bookworm's 1.0.3 drops
# an override's command and healthcheck and joins host-networked containers to the
# project network as well.
PC_VENV=$CACHE/podman-compose-1.6.0
if [ ! -f "$PC_VENV/.complete" ]; then
  rm -rf "$PC_VENV"
  python3 -m venv "$PC_VENV" && "$PC_VENV/bin/pip" install -q "podman-compose==1.6.0" && touch "$PC_VENV/.complete"
fi

# The three images need about 8 GB while they build. Each build leaves the images it
# supersedes untagged; where the disk runs low they go first (the build cache with them).
GRAPHROOT=$(podman info --format '{{.Store.GraphRoot}}')
free_gb() { df -BG --output=avail "$GRAPHROOT" | tail -1 | tr -dc 0-9; }
if [ "$(free_gb)" -lt 20 ]; then
  say "$(free_gb) GB free under $GRAPHROOT: removing untagged images"
  podman image prune -f >/dev/null
fi
[ "$(free_gb)" -ge 10 ] || fail "$(free_gb) GB free under $GRAPHROOT; building the images needs 10"

say "building images"
./scripts/deploy/build.sh coordinator worker-cpu client

# Loopback ports, free now.
read -r TF_BROKER_PORT TF_CACHE_PORT TF_STATE_PORT TF_GRPC_PORT TF_COORD_METRICS_PORT TF_WORKER_METRICS_PORT < <(
  python3 -c 'import socket
socks = [socket.socket() for _ in range(6)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
export TF_BROKER_PORT TF_CACHE_PORT TF_STATE_PORT TF_GRPC_PORT TF_COORD_METRICS_PORT TF_WORKER_METRICS_PORT
compose() {
  "$PC_VENV/bin/python" -m podman_compose -p "$PROJECT" -f docker-compose.yml -f tests/deploy/compose.test.yml "$@"
}
container() {  # the container of compose service $1
  podman ps -a --filter "label=com.docker.compose.project=$PROJECT" \
    --filter "label=com.docker.compose.service=$1" --format '{{.Names}}' | head -1
}

teardown() {
  local rc=$?
  if [ $rc -ne 0 ]; then
    for svc in init coordinator worker-cpu; do
      c=$(container "$svc" || true)
      [ -n "$c" ] && { say "last log lines of $svc:"; podman logs --tail 40 "$c" 2>&1 | sed 's/^/  | /' >&2 || true; }
    done
  fi
  if [ "${TORCHFARM_DEPLOY_KEEP:-0}" != 1 ]; then
    for c in A B C; do podman rm -f -t 0 "$PROJECT-client-$c" >/dev/null 2>&1 || true; done
    compose down -v -t 5 >/dev/null 2>&1 || true
    rm -rf "$WORK"
  fi
  say "wall time $((SECONDS - START)) s"
  podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep 'torchfarm/' | sed 's/^/  image /' >&2 || true
  [ $rc -eq 0 ] && say "PASSED" || say "FAILED (exit $rc)"
}
trap teardown EXIT
compose down -v -t 1 >/dev/null 2>&1 || true  # a run killed before its teardown

say "compose up: init"
compose up -d --no-build init >"$WORK/up-init.log" 2>&1 || { cat "$WORK/up-init.log" >&2; fail "compose up init"; }
[ "$(timeout 120 podman wait "$(container init)")" = 0 ] || fail "init did not exit 0"

say "compose up: redis"
compose up -d --no-build --no-deps redis-broker redis-cache redis-state >"$WORK/up-redis.log" 2>&1 \
  || { cat "$WORK/up-redis.log" >&2; fail "compose up redis"; }
wait_until 60 podman exec "$(container redis-broker)" redis-cli -p "$TF_BROKER_PORT" ping || fail "redis-broker"
wait_until 60 podman exec "$(container redis-cache)" redis-cli -p "$TF_CACHE_PORT" ping || fail "redis-cache"
wait_until 60 podman exec "$(container redis-state)" redis-cli -p "$TF_STATE_PORT" ping || fail "redis-state"

say "compose up: coordinator, worker"
compose up -d --no-build --no-deps coordinator worker-cpu >"$WORK/up-farm.log" 2>&1 \
  || { cat "$WORK/up-farm.log" >&2; fail "compose up coordinator worker"; }

# What a client on another machine is given, copied out of the client-secrets volume
# as docs/operations.md says, and owned by the client's own user.
mkdir -p "$WORK/client"
podman run --rm --network none -v "${PROJECT}_client-secrets:/s:ro" \
  "localhost/torchfarm/coordinator:$VERSION" tar -C /s -c . | tar -x -C "$WORK/client"
chown -R 20001:20001 "$WORK/client"

# A client container: its own file system and install path, the farm by the name in
# its TLS certificate (host networking, "coordinator" resolving to loopback).
client() {
  podman run --rm --network host --add-host coordinator:127.0.0.1 \
    -v "$WORK/client:/home/trainer/.torchfarm:ro" \
    -e TORCHFARM_REMOTE="grpc://coordinator:$TF_GRPC_PORT" "$@"
}
status() { client "$CLIENT_IMAGE" torchfarm status --remote "grpc://coordinator:$TF_GRPC_PORT" "$@"; }
worker_listed() { status 2>&1 | tee "$WORK/status.txt" | grep -q deploy-test-cpu; }

say "waiting for the worker to register (warm-up)"
wait_until 240 worker_listed || { cat "$WORK/status.txt" >&2; fail "torchfarm status never listed the worker"; }
say "torchfarm status through the farm lists the worker:"
sed 's/^/  | /' "$WORK/status.txt" >&2

run_client() {  # NAME EXPECT [client_check.py args]
  local name=$1 expect=$2; shift 2
  say "client $name: trains --model $MODEL through the farm, expects: $expect"
  timeout 900 podman run --rm --name "$PROJECT-client-$name" --network host \
    --add-host coordinator:127.0.0.1 -v "$WORK/client:/home/trainer/.torchfarm:ro" \
    -e TORCHFARM_REMOTE="grpc://coordinator:$TF_GRPC_PORT" "$CLIENT_IMAGE" \
    python client_check.py --expect "$expect" --model "$MODEL" --steps 2 "$@" >"$WORK/client-$name.log" 2>&1 \
    || { tail -30 "$WORK/client-$name.log" >&2; fail "client $name"; }
  grep -E '^(CLIENT-RESULT|\{)' "$WORK/client-$name.log" | sed 's/^/  | /' >&2
}
run_client A compiled
run_client B hit

# C: a model no client compiled yet, so its compile is cold; stop the worker while the
# farm runs it.
say "client C: a cold compile (--model gpt-deeper); the worker is stopped during it"
podman run -d --name "$PROJECT-client-C" --network host --add-host coordinator:127.0.0.1 \
  -v "$WORK/client:/home/trainer/.torchfarm:ro" -e TORCHFARM_REMOTE="grpc://coordinator:$TF_GRPC_PORT" \
  "$CLIENT_IMAGE" python client_check.py --expect compiled --model gpt-deeper --steps 2 >/dev/null
# The key of a job a worker has taken (RUNNING), once there is one.
running() {
  status --json 2>/dev/null | python3 -c 'import json, sys
jobs = [j for j in json.load(sys.stdin).get("in_flight", []) if j.get("state") in ("RUNNING", 2)]
print(jobs[0]["key"]) if jobs else sys.exit(1)' >"$WORK/running-key"
}
wait_until 300 running || fail "client C's compile never ran"
key=$(cat "$WORK/running-key")
worker=$(container worker-cpu)
say "stopping $worker mid-compile"
podman stop -t 2 "$worker" >/dev/null
podman start "$worker" >/dev/null
say "worker started again; waiting for client C"
rc=$(timeout 900 podman wait "$PROJECT-client-C" || echo timeout)
podman logs "$PROJECT-client-C" >"$WORK/client-C.log" 2>&1 || true
[ "$rc" = 0 ] || { tail -30 "$WORK/client-C.log" >&2; fail "client C exited $rc"; }
grep '^CLIENT-RESULT' "$WORK/client-C.log" | sed 's/^/  | /' >&2
podman rm "$PROJECT-client-C" >/dev/null
# The job the worker held when it was stopped finished. (Which stage the stop hit
# varies: a graph job redelivered counts in `attempts`, a lowering or a kernel build in
# its own stage counter; client C's artifact above is what the test holds to.)
status --json 2>/dev/null | KEY=$key python3 -c 'import json, os, sys
status = json.load(sys.stdin)
jobs = [j for j in status.get("recent_jobs", []) + status.get("in_flight", []) if j["key"] == os.environ["KEY"]]
if not jobs:
    print("  | the stopped job is not among the recent jobs", file=sys.stderr)
    sys.exit(1)
j = jobs[0]
key, state, attempts = j["key"], j["state"], j.get("attempts", 0)
print(f"  | job {key[:12]}: {state} after {attempts} graph-job deliveries", file=sys.stderr)
sys.exit(0 if j["state"] in ("SUCCEEDED", 3) else 1)' \
  || fail "the job stopped mid-compile did not complete"

wait_until 240 worker_listed || fail "the restarted worker is not listed"
# Its sandboxed builds forked from a forkserver under bubblewrap (workers/sandbox/process.py),
# not from a child each, which is the fallback when the server cannot start.
podman logs "$(container worker-cpu)" >"$WORK/worker.log" 2>&1 || true
grep "forkserver did not start" "$WORK/worker.log" >&2 && fail "the worker's sandbox forkserver did not start"
grep "forkserver is ready (bwrap" "$WORK/worker.log" | sed 's/^/  | /' >&2 \
  || fail "the worker's sandbox forkserver never said it was ready"
say "all checks passed"
