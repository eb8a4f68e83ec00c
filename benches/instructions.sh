#!/usr/bin/env bash
# Instructions per request, counted by valgrind's callgrind: a figure that does not move
# with machine noise (the same binary, inputs and environment give the same count to
# within a fraction of a percent), so a regression on the send path shows as a number.
#
#   benches/instructions.sh                 # seed message/send and 1.0 SendMessage: memory, log, redb
#   A2AD_INSN_REQUESTS=5000 benches/instructions.sh
#   A2AD_INSN_BIN=/path/to/older/a2ad benches/instructions.sh   # the same for another build
#   A2AD_INSN_SCENARIO=webhooks A2AD_INSN_DIALECTS=seed benches/instructions.sh
#     # per task with its webhook delivery (one agent-wide configuration, every delivery
#     # received by the tool's receiver and its signature checked)
#   A2AD_INSN_LOAD_ARGS=--h2 A2AD_INSN_DIALECTS="v1 rest" benches/instructions.sh
#     # the same calls over cleartext HTTP/2: what HTTP/2 costs beside HTTP/1.1 and gRPC
#   A2AD_INSN_THREADS=1 A2AD_INSN_STORES=log A2AD_INSN_DIALECTS=seed A2AD_INSN_CONNS=4 benches/instructions.sh
#     # also each thread's share (the request runtime's workers, the log's committer):
#     # where a store's own work runs (`A2AD_INSN_KEEP=DIR` then keeps a file per thread)
#   A2AD_INSN_SCENARIO=gateway A2AD_INSN_STORES=memory benches/instructions.sh
#     # per task forwarded: the measured server's `echo` is an `a2a` agent fronting the
#     # `echo` of another a2ad (memory store, not under valgrind); its instructions are the
#     # front's alone, the upstream's own work not counted
#
# For each (store, dialect): starts the release a2ad under callgrind with a bench
# configuration, warms it with 300 requests, zeroes the counters, sends N requests
# (`a2ad-load --requests N`, one connection and four connections), dumps the counters and
# prints the process's instructions (every thread: hyper, the actors, the committer) per
# request — without the store's spinner (`store.sync_spin_us = 0`; `A2AD_INSN_SPIN=1`
# keeps it), whose loop fills the disk's wait with instructions that are no request's.
# Needs valgrind and a release build (`cargo build --release`).
set -euo pipefail

cd "$(dirname "$0")/.."
N=${A2AD_INSN_REQUESTS:-2000}
BIN=${A2AD_INSN_BIN:-target/release/a2ad}
LOAD=target/release/a2ad-load
[ -x "$BIN" ] && [ -x "$LOAD" ] || { echo "run cargo build --release first" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 2; }

WORK=$(mktemp -d)
SERVER=
cleanup() {
  [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null && wait "$SERVER" 2>/dev/null
  [ -n "${UPSTREAM:-}" ] && kill "$UPSTREAM" 2>/dev/null && wait "$UPSTREAM" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
KEY=insn-key-0123456789
SCENARIO=${A2AD_INSN_SCENARIO:-send}
case "$SCENARIO" in send|webhooks|gateway) ;; *) echo "A2AD_INSN_SCENARIO: send, webhooks or gateway" >&2; exit 2;; esac
LOAD_SCENARIO=$SCENARIO
[ "$SCENARIO" = gateway ] && LOAD_SCENARIO=send

# `gateway`: the upstream the measured front forwards to (started once).
UPSTREAM=
BACKEND=
if [ "$SCENARIO" = gateway ]; then
  cat >"$WORK/upstream.toml" <<EOF
[server]
listen = "127.0.0.1:0"
[store]
backend = "memory"
[[api_keys]]
name = "insn"
key = "$KEY"
[[agents]]
id = "echo"
[agents.limits]
requests_per_minute = 1000000000
concurrent_tasks = 100000
max_queued_tasks = 100000
EOF
  RUST_LOG=warn "$BIN" --config "$WORK/upstream.toml" >"$WORK/upstream.log" 2>&1 &
  UPSTREAM=$!
  up_url=
  for _ in $(seq 1 300); do
    up_url=$(grep -o 'listening on http://[0-9.:]*' "$WORK/upstream.log" | head -1 | sed 's/listening on //') || true
    [ -n "$up_url" ] && break
    sleep 0.1
  done
  [ -n "$up_url" ] || { cat "$WORK/upstream.log" >&2; echo "the upstream did not start" >&2; exit 1; }
  BACKEND="backend = \"a2a\"
[agents.a2a]
card_url = \"$up_url/api/v1/a2a/echo/.well-known/agent-card.json\"
allow_private_networks = true
max_connections = 1000
headers = { x-api-key = \"$KEY\" }"
fi

measure() { # store dialect connections
  local store=$1 dialect=$2 conns=$3 cfg="$WORK/a2ad.toml" out="$WORK/out.log"
  rm -rf "$WORK/db" "$WORK"/cg.* && mkdir -p "$WORK/db"
  local store_cfg="backend = \"memory\""
  # No spinner (store.sync_spin_us): its loop fills the time a commit waits on the disk,
  # and counted here it would measure the disk, not the request. (A build from before the
  # setting has no spinner, and would refuse the key.)
  # `A2AD_INSN_SPIN=1` leaves it at the server's default, to see what it costs here.
  local spin=
  grep -q sync_spin_us "$BIN" && [ -z "${A2AD_INSN_SPIN:-}" ] && spin="sync_spin_us = 0"
  [ "$store" = redb ] && store_cfg="backend = \"redb\"
path = \"$WORK/db/a2ad.redb\"
$spin
${A2AD_INSN_REDB:-}"
  [ "$store" = log ] && store_cfg="backend = \"log\"
path = \"$WORK/db/log\"
$spin"
  cat >"$cfg" <<EOF
[server]
listen = "127.0.0.1:0"

[store]
$store_cfg

[webhooks]
allow_private_networks = true

[[api_keys]]
name = "insn"
key = "$KEY"

[[agents]]
id = "echo"
$BACKEND
[agents.limits]
requests_per_minute = 1000000000
concurrent_tasks = 100000
max_queued_tasks = 100000
EOF
  # The allocator's options set here: a2ad then does not re-execute itself to set them.
  # The log filter at its default (`info`): what a user's server pays for it is counted.
  local threads=no
  [ "${A2AD_INSN_THREADS:-0}" = 1 ] && threads=yes
  MIMALLOC_PURGE_DELAY=0 MIMALLOC_ALLOW_THP=0 RUST_LOG=info valgrind --tool=callgrind --quiet \
    --separate-threads=$threads --callgrind-out-file="$WORK/cg.%p" "$BIN" --config "$cfg" >"$out" 2>&1 &
  SERVER=$!
  local url=
  for _ in $(seq 1 600); do
    url=$(grep -o 'listening on http://[0-9.:]*' "$out" | head -1 | sed 's/listening on //') || true
    [ -n "$url" ] && break
    sleep 0.1
  done
  [ -n "$url" ] || { cat "$out" >&2; echo "a2ad did not start under valgrind" >&2; exit 1; }
  # Warmed with plain sends: a `webhooks` run sets a configuration, and a second one
  # would double the deliveries of the measured run.
  # shellcheck disable=SC2086
  "$LOAD" --url "$url" --key "$KEY" --dialect "$dialect" ${A2AD_INSN_LOAD_ARGS:-} --requests 300 -c "$conns" >/dev/null
  callgrind_control -z "$SERVER" >/dev/null 2>&1
  # shellcheck disable=SC2086
  "$LOAD" --url "$url" --key "$KEY" --scenario "$LOAD_SCENARIO" --dialect "$dialect" \
    ${A2AD_INSN_LOAD_ARGS:-} --requests "$N" -c "$conns" >"$WORK/load.txt"
  callgrind_control -d "$SERVER" >/dev/null 2>&1
  # The dump: one file, or (threads) one per thread, named cg.PID.1-NN.
  local dumps
  if [ "$threads" = yes ]; then
    dumps=$(ls "$WORK"/cg.*.1-* 2>/dev/null)
  else
    dumps=$(ls -t "$WORK"/cg.*.* 2>/dev/null | head -1)
  fi
  if [ -n "${A2AD_INSN_KEEP:-}" ]; then
    mkdir -p "$A2AD_INSN_KEEP"
    for f in $dumps; do
      suffix=
      [ "$threads" = yes ] && suffix=".${f##*-}"
      cp "$f" "$A2AD_INSN_KEEP/callgrind.$store.$dialect.c$conns$suffix"
    done
  fi
  if grep -q "errors: none" "$WORK/load.txt"; then :; else
    cat "$WORK/load.txt" >&2; echo "requests failed" >&2; exit 1
  fi
  if [ "$SCENARIO" = webhooks ] && ! { grep -q " lost: 0$" "$WORK/load.txt" &&
    grep -q " bad_signatures: 0$" "$WORK/load.txt"; }; then
    cat "$WORK/load.txt" >&2; echo "deliveries were lost or badly signed" >&2; exit 1
  fi
  local total=0 f n
  for f in $dumps; do
    n=$(awk '/^(summary|totals):/ {print $2; exit}' "$f")
    total=$((total + ${n:-0}))
    if [ "$threads" = yes ] && [ "${n:-0}" -gt 0 ]; then
      local role=
      grep -q 'Disk::commit' "$f" && role=" (the log's committer)"
      printf '  thread %-3s %12s Ir: %9.0f instructions per request%s\n' "${f##*-}" "$n" "$(echo "$n / $N" | bc -l)" "$role"
    fi
  done
  kill "$SERVER" && wait "$SERVER" 2>/dev/null || true
  SERVER=
  printf '%-7s %-5s c=%-2s %12s Ir for %s %s requests: %9.0f instructions per request\n' \
    "$store" "$dialect" "$conns" "$total" "$N" "$SCENARIO" "$(echo "$total / $N" | bc -l)"
}

for store in ${A2AD_INSN_STORES:-memory log redb}; do
  for dialect in ${A2AD_INSN_DIALECTS:-seed v1}; do
    for conns in ${A2AD_INSN_CONNS:-1 4}; do
      measure "$store" "$dialect" "$conns"
    done
  done
done
