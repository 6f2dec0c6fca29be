#!/bin/bash
# Start the shop (python3 -m webshop_site.server ARGS) on 127.0.0.1:PORT unless it answers
# already, and wait until it does: start.sh PORT ARGS...
port=$1; shift
ready() { (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; }
ready && exit 0
cd "$(dirname "$0")/.." || exit 1
setsid python3 -m webshop_site.server --port "$port" "$@" > /tmp/webshop-server.log 2>&1 < /dev/null &
pid=$!
for _ in $(seq 2400); do
  ready && exit 0
  kill -0 $pid 2>/dev/null || break
  sleep 0.05
done
echo "the shop did not start:" >&2; cat /tmp/webshop-server.log >&2; exit 1
