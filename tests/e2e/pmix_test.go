//go:build e2e

package e2e

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/reft-hpc/reft/pmix"
)

type probe struct {
	Hostname   string         `json:"hostname"`
	PMIx       *pmix.Topology `json:"pmix"`
	PMIxError  string         `json:"pmix_error"`
	Slurm      *pmix.Topology `json:"slurm"`
	SlurmError string         `json:"slurm_error"`
}

func probes(t *testing.T, args ...string) []probe {
	t.Helper()
	r := mustRun(t, 2*time.Minute, alice, append([]string{"srun"}, append(args, bin("reft-pmix-probe"))...)...)
	var out []probe
	for _, l := range lines(r.Stdout) {
		var p probe
		if err := json.Unmarshal([]byte(l), &p); err != nil {
			t.Fatalf("bad probe line %q: %v", l, err)
		}
		out = append(out, p)
	}
	return out
}

// TestPMIxTopology: under --mpi=pmix the binding reports every rank's node,
// matching the hostname each task sees and the Slurm-variable fallback.
func TestPMIxTopology(t *testing.T) {
	ps := probes(t, "-N3", "-n6", "--mpi=pmix")
	if len(ps) != 6 {
		t.Fatalf("%d probes, want 6", len(ps))
	}
	seen := map[int]bool{}
	for _, p := range ps {
		if p.PMIx == nil || p.Slurm == nil {
			t.Fatalf("probe on %s: pmix %q slurm %q", p.Hostname, p.PMIxError, p.SlurmError)
		}
		if p.PMIx.Source != "pmix" || p.PMIx.Size != 6 {
			t.Errorf("pmix topology %+v", *p.PMIx)
		}
		if got := p.PMIx.Nodes[p.PMIx.Rank]; got != p.Hostname {
			t.Errorf("rank %d: PMIx says node %s, hostname is %s", p.PMIx.Rank, got, p.Hostname)
		}
		pm, sl := *p.PMIx, *p.Slurm
		pm.Source, sl.Source = "", ""
		if !reflect.DeepEqual(pm, sl) {
			t.Errorf("PMIx %+v and Slurm %+v disagree", pm, sl)
		}
		seen[p.PMIx.Rank] = true
	}
	if len(seen) != 6 {
		t.Errorf("ranks seen %v, want 0..5", seen)
	}
}

// TestSlurmFallback: without PMIx (--mpi=none) the Slurm variables still give
// the right node of every rank, for a cyclic distribution too.
func TestSlurmFallback(t *testing.T) {
	for _, dist := range []string{"block", "cyclic"} {
		t.Run(dist, func(t *testing.T) {
			ps := probes(t, "-N3", "-n5", "--mpi=none", "-m", dist)
			if len(ps) != 5 {
				t.Fatalf("%d probes, want 5", len(ps))
			}
			for _, p := range ps {
				if p.PMIx != nil {
					t.Errorf("PMIx answered under --mpi=none on %s", p.Hostname)
				}
				if p.Slurm == nil {
					t.Fatalf("slurm fallback on %s: %s", p.Hostname, p.SlurmError)
				}
				if got := p.Slurm.Nodes[p.Slurm.Rank]; got != p.Hostname {
					t.Errorf("%s: rank %d placed on %s, hostname is %s", dist, p.Slurm.Rank, got, p.Hostname)
				}
			}
		})
	}
}
