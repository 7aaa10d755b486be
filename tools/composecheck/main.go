// composecheck loads a Compose file with compose-go, the library Docker Compose itself loads
// files with: the Compose Specification's schema, interpolation, extends, anchors and merge
// rules all apply. It prints the loaded project as JSON, or the loader's error and exits 1.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: composecheck <compose file>")
		os.Exit(2)
	}
	file := os.Args[1]
	options, err := cli.NewProjectOptions(
		[]string{file},
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
