#!/bin/sh
# Host discovery for `gmeta train --elastic` (horovodrun --host-discovery-script): prints
# the hosts file's `host:slots` lines (GMETA_HOSTS_FILE, default ./hosts.txt), skipping
# blank lines and comments. Edit the file while the job runs to add or remove hosts.
hosts=${GMETA_HOSTS_FILE:-hosts.txt}
if [ ! -r "$hosts" ]; then
  echo "discover_hosts.sh: cannot read the hosts file $hosts (set GMETA_HOSTS_FILE)" >&2
  exit 1
fi
grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$hosts"
