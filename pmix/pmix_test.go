package pmix

import (
	"reflect"
	"strings"
	"testing"
)

func TestExpandTasksPerNode(t *testing.T) {
	tests := []struct {
		in      string
		want    []int
		wantErr bool
	}{
		{"2", []int{2}, false},
		{"2(x3),1", []int{2, 2, 2, 1}, false},
		{"4(x2)", []int{4, 4}, false},
		{"", nil, true},
		{"x", nil, true},
		{"2(x0)", nil, true},
	}
	for _, tt := range tests {
		got, err := ExpandTasksPerNode(tt.in)
		if (err != nil) != tt.wantErr || (!tt.wantErr && !reflect.DeepEqual(got, tt.want)) {
			t.Errorf("ExpandTasksPerNode(%q) = %v, %v; want %v (err %v)", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestFromSlurm(t *testing.T) {
	base := map[string]string{
		"SLURM_PROCID": "3", "SLURM_NTASKS": "6", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
		"SLURM_STEP_NODELIST": "n[1-3]", "SLURM_STEP_TASKS_PER_NODE": "2(x3)",
	}
	with := func(kv ...string) func(string) string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	tests := []struct {
		name      string
		getenv    func(string) string
		wantNodes []string
		wantErr   string
	}{
		{"block", with(), []string{"n1", "n1", "n2", "n2", "n3", "n3"}, ""},
		{"cyclic", with("SLURM_DISTRIBUTION", "cyclic:block", "SLURM_NODEID", "0"), []string{"n1", "n2", "n3", "n1", "n2", "n3"}, ""},
		{"uneven block", with("SLURM_NTASKS", "4", "SLURM_STEP_TASKS_PER_NODE", "2,1(x2)", "SLURM_PROCID", "2"), []string{"n1", "n1", "n2", "n3"}, ""},
		{"not slurm", func(string) string { return "" }, nil, "SLURM_PROCID is not set"},
		{"bad number", with("SLURM_NTASKS", "six"), nil, `SLURM_NTASKS="six"`},
		{"rank out of range", with("SLURM_PROCID", "6"), nil, "is not below"},
		{"count mismatch", with("SLURM_STEP_TASKS_PER_NODE", "2(x2)"), nil, "3 nodes in the node list but tasks given for 2"},
		{"inconsistent node id", with("SLURM_NODEID", "2"), nil, "SLURM_NODEID"},
		{"arbitrary", with("SLURM_DISTRIBUTION", "arbitrary"), nil, "not supported without PMIx"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			topo, err := FromSlurm(tt.getenv)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(topo.Nodes, tt.wantNodes) || topo.Source != "slurm" {
				t.Fatalf("nodes %v source %q, want %v from slurm", topo.Nodes, topo.Source, tt.wantNodes)
			}
			if topo.Node() != topo.Nodes[topo.Rank] {
				t.Fatalf("Node() = %q", topo.Node())
			}
		})
	}
}

// Outside any Slurm step PMIx must report itself unavailable, not hang or crash.
func TestFromPMIxOutsideStep(t *testing.T) {
	t.Setenv("PMIX_NAMESPACE", "")
	t.Setenv("PMIX_SERVER_URI3", "")
	t.Setenv("PMIX_SERVER_URI2", "")
	t.Setenv("PMIX_SERVER_URI21", "")
	if _, err := FromPMIx(); err == nil {
		t.Fatal("FromPMIx succeeded with no PMIx server")
	}
}
