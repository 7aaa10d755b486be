#!/usr/bin/env bash
# Installs what the local stack needs from Debian's packages, only when it is missing:
# Java (Kafka's broker and Spark), Maven (resolves the Kafka jars), the PostgreSQL server.
# Idempotent and silent when everything is there; on other systems it says what to install.
set -euo pipefail

missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
if [ -z "${BRIDGE_POSTGRES_BINDIR:-}" ] \
   && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
   && ! command -v postgres >/dev/null 2>&1; then
  missing+=(postgresql)
fi
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "missing: ${missing[*]}. Install them (Java 17+, Maven, PostgreSQL server), or set" >&2
  echo "BRIDGE_POSTGRES_BINDIR to a directory holding initdb and pg_ctl." >&2
  exit 1
fi
echo "installing from Debian's packages: ${missing[*]}"
# The stack makes its own clusters: keep the package from creating and starting one on 5432.
mkdir -p /etc/postgresql-common
grep -qs '^create_main_cluster' /etc/postgresql-common/createcluster.conf \
  || echo 'create_main_cluster = false' >> /etc/postgresql-common/createcluster.conf
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
