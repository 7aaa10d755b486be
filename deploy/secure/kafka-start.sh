#!/usr/bin/env bash
# The secured compose broker (docker-compose.secure.yml): its storage formatted once with the
# SCRAM credentials, as KRaft requires (they live in the metadata log), then Kafka with the
# configuration `bridge stack credentials` wrote. KAFKA_HOME and SECURE_DIR: the image's paths.
set -euo pipefail
set -f  # the --add-scram arguments hold brackets: words, not patterns
kafka_home=${KAFKA_HOME:-/opt/kafka}
secure=${SECURE_DIR:-/secure}
config="$secure/kafka/server.properties"
# shellcheck disable=SC2046 # one argument per word of the file, by design
"$kafka_home/bin/kafka-storage.sh" format --ignore-formatted \
    --cluster-id "$(cat "$secure/kafka/cluster-id")" --config "$config" \
    $(cat "$secure/kafka/scram-arguments")
exec "$kafka_home/bin/kafka-server-start.sh" "$config"
