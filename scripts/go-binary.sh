# Sourced by the ensure-*.sh scripts: a Go program built once with this machine's Go toolchain
# and cached under a key that changes with what it is built from.
#
#   go_binary NAME KEY BUILD   prints the path of NAME, calling `BUILD <path>` when the cache for
#                              KEY has none yet
go_binary() {
  local name="$1" key="$2" build="$3"
  local cache="${XDG_CACHE_HOME:-$HOME/.cache}/bridge/$name-$key"
  local binary="$cache/$name"
  if [ ! -x "$binary" ]; then
    if ! command -v go >/dev/null 2>&1; then
      echo "go not found: $name is built with Go 1.24+ (https://go.dev/dl)" >&2
      return 1
    fi
    mkdir -p "$cache"
    echo "building $name with $(go version | cut -d' ' -f3)" >&2
    "$build" "$binary.tmp"
    mv "$binary.tmp" "$binary"
  fi
  echo "$binary"
}
