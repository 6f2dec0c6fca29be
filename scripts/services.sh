#!/usr/bin/env bash
# Install and start what the test suite talks to: a Docker engine (Debian's docker.io),
# debootstrap for base images (the SWE envs' Debian base too), and Chromium for the
# dashboard's screenshot test and the docs site's (tests/test_docs_site.py drives it with
# playwright's client, the docs extra: no browser download). Idempotent; only acts as root.
# Under CI=true a missing service is an error, never a reason to skip tests.
set -euo pipefail

log() { echo "[services] $*" >&2; }

# --swe: only what building the SWE envs needs (make demo): debootstrap for their Debian base.
swe_only=false
[ "${1:-}" = --swe ] && swe_only=true

need_apt=()
command -v debootstrap >/dev/null 2>&1 || need_apt+=(debootstrap)
if ! $swe_only; then
  # a sandbox's own network (network=True): veths and tc (iproute2), its filter rules (iptables);
  # the network tests' lab: a test CA (openssl), pip and Node inside sandboxes (python3-pip, nodejs)
  command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || need_apt+=(iproute2)
  command -v iptables >/dev/null 2>&1 || need_apt+=(iptables)
  command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
  /usr/bin/python3 -m pip --version >/dev/null 2>&1 || need_apt+=(python3-pip)
  command -v node >/dev/null 2>&1 || need_apt+=(nodejs)  # Node's trust of an inspecting sandbox's CA
  command -v dockerd >/dev/null 2>&1 || need_apt+=(docker.io)
  command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
  command -v tmux >/dev/null 2>&1 || need_apt+=(tmux)  # terminals: tmux in a host-image sandbox
fi

if [ "${#need_apt[@]}" -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    log "not root: cannot install ${need_apt[*]}; docker tests will be skipped"
    [ "${CI:-}" = true ] && exit 1
    exit 0
  fi
  log "installing ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

$swe_only && exit 0

if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    log "starting dockerd"  # in a session of its own: it outlives the shell (and process group) that started it
    setsid nohup dockerd --host unix:///var/run/docker.sock >/tmp/rockroll-dockerd.log 2>&1 &
    for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  fi
fi
if docker info >/dev/null 2>&1; then
  log "docker engine ready"
else
  log "no docker engine (see /tmp/rockroll-dockerd.log)"
  [ "${CI:-}" = true ] && exit 1
fi
exit 0
