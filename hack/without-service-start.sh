#!/usr/bin/env bash
# Run a command (an apt-get install through hack/host-packages.sh) with Debian's policy-rc.d
# answering 101, "action forbidden", so that no package's postinst starts its service: RabbitMQ's
# would start a system node (and epmd) listening on every interface, which nothing here wants,
# since the benchmark starts its own node on loopback. An existing policy-rc.d is put back after.
#   hack/without-service-start.sh hack/host-packages.sh /usr/lib/rabbitmq/bin/rabbitmq-server=rabbitmq-server
set -euo pipefail

policy=/usr/sbin/policy-rc.d
if [[ "$(id -u)" != 0 ]] || { [[ -x $policy ]] && grep -qx 'exit 101' "$policy"; }; then
  exec "$@"  # not root: host-packages.sh says what to install by hand; or services are already held
fi
backup=""
if [[ -e $policy ]]; then
  backup=$(mktemp)
  cp -p "$policy" "$backup"
fi
restore() { if [[ -n $backup ]]; then mv "$backup" "$policy"; else rm -f "$policy"; fi; }
trap restore EXIT
printf '#!/bin/sh\n# hack/without-service-start.sh: no service starts during this install\nexit 101\n' >"$policy"
chmod 755 "$policy"
"$@"
