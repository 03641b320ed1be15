#!/usr/bin/env bash
# The main job, as `make demo` runs it: start `hpo serve` (SQLite + a local Ray), submit a
# study over REST, follow its progress, print the best trial, download its model
# (hpo model), shut the server down cleanly, and end by pointing to the study's dashboard
# page and to the best model's commands (hpo model, python -m trainers evaluate).
#
#   examples/serve-demo.sh [SPEC]        (default: examples/digits-tpe-asha.yaml)
#
# Environment: BIN (the venv's bin, default .venv/bin), DEMO_DIR (default runs/demo, wiped
# first), DEMO_PORT (default 8765), DEMO_MIN_ACCURACY (default 0.97), DEMO_KEEP: 1 keeps
# serving the dashboard after the study until Ctrl-C, 0 stops at once; unset, the demo keeps
# serving until Enter or Ctrl-C on a terminal and stops at once elsewhere (CI).
set -euo pipefail

BIN=${BIN:-.venv/bin}
DIR=${DEMO_DIR:-runs/demo}
PORT=${DEMO_PORT:-8765}
SPEC=${1:-examples/digits-tpe-asha.yaml}
KEEP=${DEMO_KEEP:-}
if [ -z "$KEEP" ]; then
    if [ -t 0 ] && [ -t 1 ]; then KEEP=enter; else KEEP=0; fi
fi
MIN_ACCURACY=${DEMO_MIN_ACCURACY:-0.97}

# Checked before the last demo's folder is wiped: a refused demo leaves it as it was.
for tool in hpo python; do
    if [ ! -x "$BIN/$tool" ]; then
        echo "no $BIN/$tool: run make install first, or set BIN" >&2
        exit 1
    fi
done
NAME=$("$BIN/python" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["name"])' \
       "$SPEC" 2>/dev/null) || { echo "cannot read the study name of the spec $SPEC" >&2; exit 1; }
port_free=0
"$BIN/python" -c 'import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1)
except OSError:
    sys.exit(3)' "$PORT" 2>/dev/null || port_free=$?
if [ "$port_free" = 0 ]; then
    echo "port $PORT is taken (another server?); set DEMO_PORT" >&2
    exit 1
elif [ "$port_free" != 3 ]; then
    echo "DEMO_PORT must be a port number, got '$PORT'" >&2
    exit 1
fi
export HPO_DATABASE_URL="sqlite:///$DIR/hpo.db" HPO_RESULTS_DIR="$DIR/results"
export HPO_PORT="$PORT" HPO_URL="http://127.0.0.1:$PORT"
"$BIN/python" -c 'import os, sys
from service.errors import SettingsError
from service.settings import Settings
try:
    Settings.from_env(os.environ)
except SettingsError as e:
    sys.exit(f"error: {e}")'  # a bad HPO_* setting: the server would refuse it
rm -rf "$DIR"
mkdir -p "$DIR"
HPO_TOKEN="$("$BIN/hpo" token create demo --admin 2>"$DIR/token.log")" || {
    cat "$DIR/token.log" >&2
    exit 1
}
export HPO_TOKEN

ready() {
    "$BIN/python" -c 'import sys, httpx
sys.exit(httpx.get(sys.argv[1] + "/readyz", timeout=2).status_code != 200)' "$HPO_URL" 2>/dev/null
}

echo "== starting hpo serve on $HPO_URL (log: $DIR/serve.log)"
"$BIN/hpo" serve >"$DIR/serve.log" 2>&1 &
SERVER=$!
stop_server() {
    if kill -0 "$SERVER" 2>/dev/null; then
        echo "== stopping the server"
        kill -TERM "$SERVER"
        wait "$SERVER" && echo "== server stopped cleanly" || echo "== server exited with $?"
    fi
}
trap stop_server EXIT
for _ in $(seq 1 300); do
    ready && break
    if ! kill -0 "$SERVER" 2>/dev/null; then
        echo "hpo serve exited early:" >&2
        tail -n 30 "$DIR/serve.log" >&2
        exit 1
    fi
    sleep 0.5
done
ready || { echo "hpo serve is not ready after 150 s" >&2; exit 1; }

echo "== submitting $SPEC over REST (POST /v1/studies)"
"$BIN/hpo" submit "$SPEC" --wait
if "$BIN/python" - "$HPO_URL" "$HPO_TOKEN" "$NAME" "$MIN_ACCURACY" "$KEEP" "$BIN" "$DIR" \
        <<'PY'
import sys

import httpx

url, token, name, minimum = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
keep, bin_dir, demo_dir = sys.argv[5], sys.argv[6], sys.argv[7]
study = httpx.get(f"{url}/v1/studies/{name}", headers={"Authorization": f"Bearer {token}"}).json()
best = study["best_trial"]["value"]
print(f"== best val_accuracy {best:.4f} (goal >= {minimum}); "
      f"{study['device_seconds']:.0f} CPU-seconds used")
if keep == "0":
    print("== (the server stops now; DEMO_KEEP=1 make demo keeps it serving the dashboard)")
# the pointers the demo ends with (shown last, once the model is downloaded)
with open(f"{demo_dir}/next-steps.txt", "w") as f:
    f.write(f"== study page: {url}{study['dashboard_url']} - log in with the token {token}\n"
            f"== best model (trial {study['best_trial']['number']}), while the server runs: "
            f"HPO_URL={url} HPO_TOKEN={token} {bin_dir}/hpo model {name} -o best.pt\n"
            f"==   evaluate the copy this demo saved: {bin_dir}/python -m trainers evaluate "
            f"{demo_dir}/best.pt\n")
sys.exit(0 if best >= minimum else 1)
PY
then
    OK=1
else
    OK=0
fi
echo "== downloading the best trial's model (hpo model $NAME -o $DIR/best.pt)"
"$BIN/hpo" model "$NAME" -o "$DIR/best.pt"

if [ "$KEEP" = "0" ]; then
    stop_server
fi
cat "$DIR/next-steps.txt"
if [ "$KEEP" = "1" ]; then
    echo "== serving the dashboard until Ctrl-C"
    wait "$SERVER" || true
elif [ "$KEEP" = "enter" ]; then
    echo "== serving the dashboard until you press Enter or Ctrl-C"
    read -r _ || true
fi
[ "$OK" = "1" ]
