//go:build e2e

// Package cluster tests the test-cluster tool itself. It takes the cluster
// down, so `make e2e` runs it after the end-to-end suite.
package cluster

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func tool(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("./cluster", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("cluster %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func stateDir() string {
	if d := os.Getenv("REFT_CLUSTER_DIR"); d != "" {
		return d
	}
	return "/var/tmp/reft-cluster"
}

// recorded returns the daemons' recorded pids and the nodes' mount namespaces.
func recorded(t *testing.T) (pids map[string]int, namespaces []string) {
	t.Helper()
	run := filepath.Join(stateDir(), "run")
	files, _ := filepath.Glob(filepath.Join(run, "*.pid"))
	pids = map[string]int{}
	for _, f := range files {
		if strings.HasSuffix(f, ".daemon.pid") {
			continue // written by the daemons themselves; the same pids
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		pids[strings.TrimSuffix(filepath.Base(f), ".pid")] = pid
	}
	nsFiles, _ := filepath.Glob(filepath.Join(run, "*.mntns"))
	for _, f := range nsFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		namespaces = append(namespaces, strings.TrimSpace(string(b)))
	}
	return pids, namespaces
}

// clusterPrograms are the executables of the cluster and of reft's own
// per-node processes; none of this cluster's may outlive `down`.
var clusterPrograms = map[string]bool{
	"slurmctld": true, "slurmd": true, "slurmstepd": true, "slurmdbd": true,
	"mariadbd": true, "munged": true, "reft-agent": true,
}

// ofThisCluster tells whether a process names this cluster's state directory
// in its command line or environment (every daemon does: -f/--datadir/
// --socket/SLURM_CONF), so a second cluster on the machine is left alone.
func ofThisCluster(proc string) bool {
	for _, f := range []string{"/cmdline", "/environ"} {
		if b, err := os.ReadFile(proc + f); err == nil && strings.Contains(string(b), stateDir()+"/") {
			return true
		}
	}
	return false
}

// TestUpTwiceThenDown: a second `up` changes nothing, and `down` leaves no
// process of the cluster behind: no recorded pid, nothing in a node's
// namespace, and no cluster program at all.
func TestUpTwiceThenDown(t *testing.T) {
	tool(t, "up")
	before, nss := recorded(t)
	if len(before) < 5 || len(nss) == 0 {
		t.Fatalf("after up: recorded pids %v, node namespaces %v", before, nss)
	}
	tool(t, "up")
	after, _ := recorded(t)
	for name, pid := range before {
		if after[name] != pid {
			t.Errorf("second up replaced %s: pid %d -> %d", name, pid, after[name])
		}
	}
	if out := tool(t, "status"); !strings.Contains(out, "idle") {
		t.Errorf("status after second up shows no idle node:\n%s", out)
	}

	tool(t, "down")

	for name, pid := range before {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
			t.Errorf("%s (pid %d) still runs after down", name, pid)
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		if ns, err := os.Readlink(p + "/ns/mnt"); err == nil {
			for _, want := range nss {
				if ns == want {
					t.Errorf("process %s still lives in node namespace %s", filepath.Base(p), ns)
				}
			}
		}
		if exe, err := os.Readlink(p + "/exe"); err == nil && clusterPrograms[filepath.Base(strings.TrimSuffix(exe, " (deleted)"))] && ofThisCluster(p) {
			t.Errorf("process %s (%s) of this cluster still runs after down", filepath.Base(p), exe)
		}
	}
	if _, err := exec.Command("./cluster", "status").CombinedOutput(); err == nil {
		t.Error("status reports the cluster up after down")
	}
}

// TestErrors: bad input is refused with a message naming the fix.
func TestErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"up", "--nodes", "0"}, "--nodes must be a number from 1 to 64"},
		{[]string{"up", "--shm", "lots"}, "--shm must be a tmpfs size"},
		{[]string{"up", "--bogus"}, "unknown option '--bogus'"},
		{[]string{"kill-node", "x7"}, "bad node name 'x7'"},
		{[]string{"frob"}, "unknown command 'frob'"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, "_"), func(t *testing.T) {
			out, err := exec.Command("./cluster", tt.args...).CombinedOutput()
			if err == nil {
				t.Fatalf("cluster %v succeeded, want failure", tt.args)
			}
			if !strings.Contains(string(out), tt.want) {
				t.Errorf("cluster %v said %q, want it to contain %q", tt.args, out, tt.want)
			}
		})
	}
}

// TestNotRoot: an unprivileged user is told to use root.
func TestNotRoot(t *testing.T) {
	out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "./cluster", "up").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "must run as root") {
		t.Fatalf("up as nobody: err %v, output %q; want 'must run as root'", err, out)
	}
}

// TestStartFailures runs after TestUpTwiceThenDown (the main cluster is down):
// a throwaway cluster in its own state directory meets a taken port and a
// daemon that cannot start, and each error names the cause, shows the
// daemon's log and leaves nothing running after `down`.
func TestStartFailures(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(t *testing.T, dir string, portBase int)
		want    []string
	}{
		{
			name: "port taken",
			prepare: func(t *testing.T, dir string, portBase int) {
				l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", portBase+6))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { l.Close() })
			},
			want: []string{fmt.Sprintf("port %d for MariaDB is already in use", 26806), "REFT_CLUSTER_PORT_BASE"},
		},
		{
			name: "daemon does not come up",
			prepare: func(t *testing.T, dir string, portBase int) {
				// A data directory without its system tables: mariadbd exits.
				if err := os.MkdirAll(filepath.Join(dir, "mysql", "mysql"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := exec.Command("chown", "-R", "mysql:mysql", filepath.Join(dir, "mysql")).Run(); err != nil {
					t.Fatal(err)
				}
			},
			want: []string{"MariaDB exited during start-up", "--- last 20 lines of"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const portBase = 26800
			dir, err := os.MkdirTemp("/var/tmp", "reft-cluster-test-")
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			env := append(os.Environ(), "REFT_CLUSTER_DIR="+dir, fmt.Sprintf("REFT_CLUSTER_PORT_BASE=%d", portBase))
			t.Cleanup(func() {
				down := exec.Command("./cluster", "down")
				down.Env = env
				if out, err := down.CombinedOutput(); err != nil {
					t.Errorf("down: %v\n%s", err, out)
				}
				os.RemoveAll(dir)
			})
			tt.prepare(t, dir, portBase)
			up := exec.Command("./cluster", "up", "--nodes", "1")
			up.Env = env
			out, err := up.CombinedOutput()
			if err == nil {
				t.Fatalf("up succeeded, want failure:\n%s", out)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("up output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}
