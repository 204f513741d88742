//go:build e2e

// Package cluster tests the test-cluster tool itself. It takes the cluster
// down, so `make e2e` runs it after the end-to-end suite.
package cluster

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
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
	"mariadbd": true, "munged": true, "reft-agent": true, "prometheus-node-exporter": true,
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

// TestUpTwiceThenDown: `up` installs reft (the plugstack line naming the
// checkout's plugin and the cluster's reft.toml, node_exporter serving
// the metrics directory, env's lines for a user's shell), asking for it
// without reft while it is up is refused, a second `up` changes nothing,
// and `down` leaves no process of the cluster behind: no recorded pid,
// nothing in a node's namespace, and no cluster program at all. It starts
// from a cluster that is down: `make e2e` runs the suite on `up --no-reft`.
func TestUpTwiceThenDown(t *testing.T) {
	tool(t, "down")
	tool(t, "up")
	before, nss := recorded(t)
	if len(before) < 6 || len(nss) == 0 || before["node_exporter"] == 0 {
		t.Fatalf("after up: recorded pids %v (want node_exporter's among them), node namespaces %v", before, nss)
	}
	etc := filepath.Join(stateDir(), "etc")
	repo, _ := filepath.Abs("../..")
	plug, err := os.ReadFile(filepath.Join(etc, "plugstack.conf.d", "reft.conf"))
	if want := fmt.Sprintf("optional %s/build/spank_reft.so config=%s/reft.toml\n", repo, etc); err != nil || string(plug) != want {
		t.Errorf("plugstack line %q (%v), want %q", plug, err, want)
	}
	env := tool(t, "env")
	for _, want := range []string{"export REFT_CONFIG=" + etc + "/reft.toml\n", "export PATH=" + repo + "/build:$PATH\n",
		"export REFT_METRICS_URL=http://127.0.0.1:", "as_alice() {"} {
		if !strings.Contains(env, want) {
			t.Errorf("env lacks %q:\n%s", want, env)
		}
	}
	if st := tool(t, "status"); !strings.Contains(st, "node_exporter up") {
		t.Errorf("status shows no node_exporter:\n%s", st)
	}
	if out, err := exec.Command("./cluster", "up", "--no-reft").CombinedOutput(); err == nil || !strings.Contains(string(out), "up with reft installed; run 'cluster down'") {
		t.Errorf("up --no-reft on a cluster up with reft: %v\n%s", err, out)
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
		{[]string{"flap", "n1", "soon"}, "SECONDS must be a number"},
		{[]string{"stall", "n1", "-1"}, "SECONDS must be a number"},
		{[]string{"delay", "n1", "1.5"}, "MS must be a whole number"},
		{[]string{"rate", "n1", "fast"}, "RATE must be a whole number followed by kbit, mbit or gbit"},
		{[]string{"rate", "n1", "0mbit"}, "use 'rate NODE off' to lift a cap"},
		{[]string{"rate", "n1"}, "usage: cluster rate NODE RATE|off"},
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

// TestNetFaults: a throwaway cluster with --net. Each node has its own
// address on the tool's bridge; partition drops packets silently (a
// connect times out, it is not refused), from every peer or from some,
// heal and flap restore them, stall freezes the node's processes and
// thaws them, delay makes a node's round trips longer and is undone by
// 'delay NODE 0' and by kill-node, and down removes the bridge and stops
// any relay.
func TestNetFaults(t *testing.T) {
	const portBase = 27800
	dir, err := os.MkdirTemp("/var/tmp", "reft-cluster-net-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "REFT_CLUSTER_DIR="+dir, fmt.Sprintf("REFT_CLUSTER_PORT_BASE=%d", portBase))
	run := func(args ...string) (string, error) {
		c := exec.Command("./cluster", args...)
		c.Env = env
		out, err := c.CombinedOutput()
		return string(out), err
	}
	must := func(args ...string) string {
		t.Helper()
		out, err := run(args...)
		if err != nil {
			t.Fatalf("cluster %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	const bridge = "rftbr27800"
	var relayPid string // n3's delay relay, left for down to stop
	t.Cleanup(func() {
		if out, err := run("down"); err != nil {
			t.Errorf("down: %v\n%s", err, out)
		}
		if err := exec.Command("ip", "link", "show", bridge).Run(); err == nil {
			t.Errorf("the bridge %s is left after down", bridge)
		}
		if out, _ := exec.Command("ip", "-o", "link", "show").Output(); strings.Contains(string(out), "rftv27800-") || strings.Contains(string(out), "rftw27800-") {
			t.Errorf("a node's veth or a delay relay's is left after down:\n%s", out)
		}
		if relayPid != "" {
			if b, err := os.ReadFile("/proc/" + relayPid + "/cmdline"); err == nil && strings.Contains(string(b), "reft-delayline") {
				t.Errorf("n3's delay relay (pid %s) runs after down", relayPid)
			}
		}
		os.RemoveAll(dir)
	})
	must("up", "--nodes", "3", "--net", "--shm", "256m")
	if out := must("status"); strings.Count(out, "idle") != 3 {
		t.Fatalf("status after up --net: want three idle nodes\n%s", out)
	}
	pid := func(node string) string {
		b, err := os.ReadFile(filepath.Join(dir, "run", "slurmd-"+node+".pid"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	// reach says how a TCP connect from node's namespace to to's slurmd
	// ends: "open", "silent" (timed out, or no route: the kernel gave up
	// resolving the address of a node that does not answer, which it
	// does about 3 s after the link was cut once its neighbour entry has
	// gone stale), "refused", or what else bash said.
	const subnet = "10.201.28." // (27800 / 100) % 250
	reach := func(from, to string) string {
		addr := fmt.Sprintf("%s%s/%d", subnet, to[1:], portBase+100+int(to[1]-'0'))
		out, err := exec.Command("nsenter", "--net=/proc/"+pid(from)+"/ns/net", "timeout", "3", "bash", "-c", "</dev/tcp/"+addr).CombinedOutput()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return "open"
		case errors.As(err, &ee) && ee.ExitCode() == 124, strings.Contains(string(out), "No route to host"):
			return "silent"
		case strings.Contains(string(out), "Connection refused"):
			return "refused"
		}
		return fmt.Sprintf("failed (%v: %s)", err, strings.TrimSpace(string(out)))
	}
	for _, step := range []struct {
		args []string
		want map[[2]string]string
		fail string // the command must fail, saying this
	}{
		{nil, map[[2]string]string{{"n1", "n2"}: "open", {"n3", "n2"}: "open", {"n2", "n1"}: "open"}, ""},
		// From everything: n2's bridge port stops forwarding.
		{[]string{"partition", "n2"}, map[[2]string]string{{"n1", "n2"}: "silent", {"n3", "n2"}: "silent", {"n2", "n1"}: "silent", {"n1", "n3"}: "open"}, ""},
		// Moving n2 onto a relay's port would reconnect it.
		{[]string{"delay", "n2", "100"}, map[[2]string]string{{"n1", "n2"}: "silent"}, "run 'cluster heal n2' first"},
		{[]string{"heal", "n2"}, map[[2]string]string{{"n1", "n2"}: "open", {"n2", "n3"}: "open"}, ""},
		{[]string{"partition", "n2", "--from", "n1"}, map[[2]string]string{{"n1", "n2"}: "silent", {"n3", "n2"}: "open", {"n2", "n3"}: "open"}, ""},
		{[]string{"heal", "n2"}, map[[2]string]string{{"n1", "n2"}: "open"}, ""},
		{[]string{"flap", "n3", "1"}, map[[2]string]string{{"n1", "n3"}: "open", {"n3", "n2"}: "open"}, ""},
		// A partitioned node that is killed and revived comes back connected.
		{[]string{"partition", "n2"}, map[[2]string]string{{"n1", "n2"}: "silent"}, ""},
		{[]string{"kill-node", "n2"}, nil, ""},
		{[]string{"revive", "n2"}, map[[2]string]string{{"n1", "n2"}: "open", {"n2", "n3"}: "open"}, ""},
	} {
		switch {
		case step.fail != "":
			if out, err := run(step.args...); err == nil || !strings.Contains(out, step.fail) {
				t.Errorf("cluster %s: %v, want a failure saying %q\n%s", strings.Join(step.args, " "), err, step.fail, out)
			}
		case step.args != nil:
			must(step.args...)
		}
		for link, want := range step.want {
			if got := reach(link[0], link[1]); got != want {
				t.Errorf("after %v: %s -> %s slurmd %s, want %s", step.args, link[0], link[1], got, want)
			}
		}
	}
	// Stall: the node's slurmd is stopped while it lasts, and runs after.
	done := make(chan string, 1)
	go func() { out, _ := run("stall", "n3", "2"); done <- out }()
	stopped := false
	for i := 0; i < 100 && !stopped; i++ {
		b, _ := os.ReadFile("/proc/" + pid("n3") + "/status")
		stopped = strings.Contains(string(b), "T (stopped)")
		if !stopped {
			time.Sleep(50 * time.Millisecond)
		}
	}
	out := <-done
	b, _ := os.ReadFile("/proc/" + pid("n3") + "/status")
	if !stopped || strings.Contains(string(b), "T (stopped)") {
		t.Errorf("stall n3: seen stopped %v, stopped after: %v\n%s", stopped, strings.Contains(string(b), "T (stopped)"), out)
	}
	// Delay: a connect's round trip to n2 (SYN out, n2's SYN-ACK back, from
	// the host's address on the bridge) takes at least the delay while it
	// is on, and well under it after 'delay n2 0'. A fact about the tool
	// (the fastest of a few connects), not a timing of reft.
	const delayMS = 200
	rtt := func(to string) time.Duration {
		t.Helper()
		addr := fmt.Sprintf("%s%s:%d", subnet, to[1:], portBase+100+int(to[1]-'0'))
		best := time.Duration(0)
		for range 5 {
			start := time.Now()
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				t.Fatalf("connect to %s's slurmd at %s: %v", to, addr, err)
			}
			d := time.Since(start)
			c.Close()
			if best == 0 || d < best {
				best = d
			}
		}
		return best
	}
	must("delay", "n2", strconv.Itoa(delayMS))
	if d := rtt("n2"); d < delayMS*time.Millisecond {
		t.Errorf("delay n2 %d: the fastest connect to n2 took %v, want at least %d ms", delayMS, d, delayMS)
	}
	if d := rtt("n3"); d >= delayMS*time.Millisecond {
		t.Errorf("delay n2 %d: the fastest connect to n3 took %v; only n2 should be late", delayMS, d)
	}
	if got := reach("n1", "n2"); got != "open" {
		t.Errorf("delay n2: n1 -> n2 slurmd %s, want open", got)
	}
	must("delay", "n2", "0")
	if d := rtt("n2"); d >= delayMS*time.Millisecond/2 {
		t.Errorf("after delay n2 0: the fastest connect to n2 took %v, want well under %d ms", d, delayMS)
	}
	if out, _ := exec.Command("ip", "-o", "link", "show").Output(); strings.Contains(string(out), "rftw27800-") {
		t.Errorf("delay n2 0 left the relay's veth:\n%s", out)
	}
	// A delayed node that is killed and revived comes back undelayed and
	// connected, and down stops a relay still running (the cleanup checks).
	// rate caps both ends of a node's veth with tbf; off lifts both.
	qdiscs := func(n string) string {
		host, _ := exec.Command("tc", "qdisc", "show", "dev", "rftv27800-"+n[1:]).Output()
		node, _ := exec.Command("nsenter", "--net=/proc/"+pid(n)+"/ns/net", "tc", "qdisc", "show", "dev", "rftn"+n[1:]).Output()
		return string(host) + string(node)
	}
	must("rate", "n2", "8mbit")
	if q := qdiscs("n2"); strings.Count(q, "qdisc tbf") != 2 || strings.Count(q, "rate 8Mbit") != 2 {
		t.Errorf("rate n2 8mbit: want a tbf at 8Mbit on both ends of n2's veth, got\n%s", q)
	}
	must("rate", "n2", "off")
	if q := qdiscs("n2"); strings.Contains(q, "tbf") {
		t.Errorf("rate n2 off: a tbf is left\n%s", q)
	}
	must("delay", "n2", strconv.Itoa(delayMS))
	must("kill-node", "n2")
	must("revive", "n2")
	if d := rtt("n2"); d >= delayMS*time.Millisecond/2 {
		t.Errorf("after kill-node and revive of a delayed n2: the fastest connect took %v, want well under %d ms", d, delayMS)
	}
	must("delay", "n3", strconv.Itoa(delayMS))
	b, err = os.ReadFile(filepath.Join(dir, "run", "delay-n3.pid"))
	if err != nil {
		t.Fatalf("delay n3: no relay recorded: %v", err)
	}
	relayPid = strings.TrimSpace(string(b))
}
