// Command reft-agent is the per-node, per-job reft daemon.
package main

import (
	"fmt"
	"os"

	"github.com/reft-hpc/reft/launcher/version"
)

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "--version" || os.Args[1] == "version") {
		fmt.Println("reft-agent", version.Version)
		return
	}
	fmt.Fprintln(os.Stderr, "reft-agent: not started by the SPANK plugin; see spank/README.md")
	os.Exit(2)
}
