// Command reft is the user's and operator's tool: it launches and relaunches
// training steps, plans protection, and reads recovery logs.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/reft-hpc/reft/launcher/version"
)

const usage = `usage: reft COMMAND [ARGS]

commands:
  version    print the reft version
  help       print this help
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "version", "--version":
		fmt.Fprintln(stdout, "reft", version.Version)
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "reft: unknown command %q; run 'reft help' for the list\n", args[0])
		return 2
	}
}
