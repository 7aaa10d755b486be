// composecheck loads a Compose file with compose-go, the library Docker Compose itself loads
// files with: the Compose Specification's schema, interpolation, extends, anchors and merge
// rules all apply. Several files merge as `docker compose -f a.yml -f b.yml` merges them (an
// overlay after its base). It prints the loaded project as JSON, or the loader's error and
// exits 1.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: composecheck <compose file> [<overlay file>...]")
		os.Exit(2)
	}
	files := os.Args[1:]
	file := strings.Join(files, " + ")
	options, err := cli.NewProjectOptions(
		files,
		cli.WithOsEnv,
		cli.WithDotEnv,
		cli.WithConsistency(true),
		cli.WithResolvedPaths(true),
	)
	if err == nil {
		var project any
		project, err = cli.ProjectFromOptions(context.Background(), options)
		if err == nil {
			encoder := json.NewEncoder(os.Stdout)
			encoder.SetIndent("", "  ")
			err = encoder.Encode(project)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", file, err)
		os.Exit(1)
	}
}
