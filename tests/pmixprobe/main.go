// Command reft-pmix-probe prints, as one JSON line, the topology that package
// pmix discovers from PMIx and from the Slurm variables, for the e2e tests.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/reft-hpc/reft/pmix"
)

func main() {
	out := map[string]any{}
	if t, err := pmix.FromPMIx(); err == nil {
		out["pmix"] = t
	} else {
		out["pmix_error"] = err.Error()
	}
	if t, err := pmix.FromSlurm(os.Getenv); err == nil {
		out["slurm"] = t
	} else {
		out["slurm_error"] = err.Error()
	}
	host, _ := os.Hostname()
	out["hostname"] = host
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
}
