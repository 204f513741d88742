// Command netbench prints the network-fault table from go test -v output
// on stdin (make bench-net).
package main

import (
	"fmt"
	"os"

	"github.com/reft-hpc/reft/tests/netbench"
)

func main() {
	rs, err := netbench.Parse(os.Stdin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "netbench: error: %v\n", err)
		os.Exit(1)
	}
	if len(rs) == 0 {
		fmt.Fprintln(os.Stderr, "netbench: error: no result lines in the input; run the e2enet tests with -v (make bench-net)")
		os.Exit(1)
	}
	netbench.Table(os.Stdout, netbench.Rows(rs))
}
