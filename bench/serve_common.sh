# Sourced by the bench/serve_*.sh scripts.
# with_server LABEL CLIENT_CMD... -- SERVE_FLAGS...: starts `quire serve` on a
# free port with SERVE_FLAGS, runs CLIENT_CMD with the server's URL appended
# as `--url URL`, prints "LABEL: " before the client's output, then stops
# the server.
bin=./target/release/quire
[ -x "$bin" ] || cargo build --release --bins
py="${QUIRE_PYTHON:-python3}"
with_server() {
  local label="$1"; shift
  local client=()
  while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do client+=("$1"); shift; done
  [ "$#" -gt 0 ] && shift
  local log; log=$(mktemp)
  "$bin" serve --port 0 "$@" 2>"$log" &
  local pid=$!
  local url=""
  for _ in $(seq 1 600); do
    url=$(grep -o 'http://[0-9.:]*' "$log" | head -n 1 || true)
    [ -n "$url" ] && break
    sleep 0.2
  done
  [ -n "$url" ] || { echo "server did not start: $(cat "$log")" >&2; kill "$pid"; exit 1; }
  echo -n "$label: "
  "${client[@]}" --url "$url"
  kill "$pid"; wait "$pid" 2>/dev/null || true
  rm -f "$log"
}
