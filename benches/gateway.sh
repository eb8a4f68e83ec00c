#!/usr/bin/env bash
# a2ad in front of an upstream A2A agent, beside the upstream alone (issue 56's target:
# gateway throughput ≥ 0.5× the upstream's at c=32, in the same run).
#
#   benches/gateway.sh                       # 3 rounds, 10 s each, c=32, seed message/send
#   A2AD_GW_ROUNDS=5 A2AD_GW_SECONDS=5 A2AD_GW_CONNS=64 A2AD_GW_DIALECT=v1 benches/gateway.sh
#
# Starts two release servers on loopback, both on the memory store: the upstream (an
# `echo` agent) and the front (an `a2a` agent whose card is the upstream echo's; it streams
# each task upstream). Then, round by round, `a2ad-load` sends to the upstream directly and
# to the front, and prints each figure, the medians, and the ratio front/upstream.
# The front's request costs its own work plus the upstream's (both run on this machine),
# so the ratio is what fronting costs here; the instructions a task costs the front alone
# come from `A2AD_INSN_SCENARIO=gateway benches/instructions.sh`.
# Needs a release build (`cargo build --release`).
set -euo pipefail

cd "$(dirname "$0")/.."
BIN=${A2AD_GW_BIN:-target/release/a2ad}
LOAD=target/release/a2ad-load
[ -x "$BIN" ] && [ -x "$LOAD" ] || { echo "run cargo build --release first" >&2; exit 2; }
ROUNDS=${A2AD_GW_ROUNDS:-3}
SECONDS_EACH=${A2AD_GW_SECONDS:-10}
CONNS=${A2AD_GW_CONNS:-32}
DIALECT=${A2AD_GW_DIALECT:-seed}
KEY=gw-key-0123456789

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# Starts a2ad on a config (in this shell, so that the exit trap stops it); sets URL to its
# base URL.
start() { # name config-text
  local name=$1 cfg="$WORK/$1.toml" out="$WORK/$1.log"
  printf '%s\n' "$2" >"$cfg"
  RUST_LOG=warn "$BIN" --config "$cfg" >"$out" 2>&1 &
  PIDS+=($!)
  local url=
  for _ in $(seq 1 300); do
    url=$(grep -o 'listening on http://[0-9.:]*' "$out" | head -1 | sed 's/listening on //') || true
    [ -n "$url" ] && break
    sleep 0.1
  done
  [ -n "$url" ] || { cat "$out" >&2; echo "$name did not start" >&2; exit 1; }
  URL=$url
}

COMMON="[store]
backend = \"memory\"

[[api_keys]]
name = \"gw\"
key = \"$KEY\""
LIMITS="[agents.limits]
requests_per_minute = 1000000000
concurrent_tasks = 100000
max_queued_tasks = 100000"

start upstream "[server]
listen = \"127.0.0.1:0\"
$COMMON

[[agents]]
id = \"echo\"
$LIMITS"
UP=$URL

start front "[server]
listen = \"127.0.0.1:0\"
$COMMON

[[agents]]
id = \"echo\"
backend = \"a2a\"
$LIMITS

[agents.a2a]
card_url = \"$UP/api/v1/a2a/echo/.well-known/agent-card.json\"
allow_private_networks = true
max_connections = $((CONNS * 2))
headers = { x-api-key = \"$KEY\" }"
FRONT=$URL

# The front reads the upstream's card before the first round.
"$LOAD" --url "$FRONT" --key "$KEY" --dialect "$DIALECT" --requests 200 -c 4 >/dev/null

rps() { # url
  "$LOAD" --url "$1" --key "$KEY" --dialect "$DIALECT" -c "$CONNS" -d "$SECONDS_EACH" \
    --json "$WORK/r.json" >"$WORK/r.txt"
  grep -q "errors: none" "$WORK/r.txt" || { cat "$WORK/r.txt" >&2; echo "requests failed" >&2; exit 1; }
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); r=r[0] if isinstance(r,list) else r; print("%.0f %.2f" % (r["rps"], r["p99_ms"]))' "$WORK/r.json"
}

up_rps=() front_rps=()
for round in $(seq 1 "$ROUNDS"); do
  read -r u up99 < <(rps "$UP")
  read -r f front99 < <(rps "$FRONT")
  up_rps+=("$u") front_rps+=("$f")
  printf 'round %d: upstream alone %8s req/s (p99 %s ms)   front %8s req/s (p99 %s ms)\n' \
    "$round" "$u" "$up99" "$f" "$front99"
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mu=$(median "${up_rps[@]}") mf=$(median "${front_rps[@]}")
printf 'median (c=%s, %s): upstream alone %s req/s, front %s req/s, front/upstream %.2f\n' \
  "$CONNS" "$DIALECT" "$mu" "$mf" "$(echo "$mf / $mu" | bc -l)"
