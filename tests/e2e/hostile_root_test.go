//go:build e2e

package e2e

// The hostile-user suite, root side (issue 14): reft-bob attacks the paths
// the plugin's root code uses on a node, and reft-alice's jobs. Each attack
// ends with: refused or harmless, one clear line in slurmd's log, alice's
// job unharmed, the canary files outside reft untouched, the node not
// drained. docs/SECURITY.md describes the defences.

import (
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// hostileRootNode is the node the suite attacks. Its slurmd is restarted
// with the plugin loaded, so that the prolog and the extern step (the root
// paths) run for its reft jobs, and its /dev/shm is fresh.
const hostileRootNode = "n5"

// TestHostileRoot runs the attacks in order on one node. The state
// directory and the store root are planted on a fresh node (its /dev/shm
// new, before any reft job), as an attacker would; the lock attacks come
// last because, before the fix, they drained the node.
func TestHostileRoot(t *testing.T) {
	const node = hostileRootNode
	enableReftRestarting(t, node)
	dir := sharedDir(t, alice)
	py := writeHelloPy(t, dir)

	t.Run("PlantedStateDir", func(t *testing.T) { hostileRootPlantedState(t, node, py) })
	// a fresh /dev/shm again, without the store root alice's job made
	cluster(t, "kill-node", node)
	cluster(t, "revive", node)
	t.Run("StoreAndRunDirSquatted", func(t *testing.T) { hostileRootStoreSquat(t, node, py) })
	t.Run("LogDirSquatted", func(t *testing.T) { hostileRootLogSquat(t, node, py) })
	t.Run("SupplementaryGroups", func(t *testing.T) { hostileRootGroups(t, node) })
	t.Run("RootJob", func(t *testing.T) { hostileRootJob(t, node) })
	t.Run("LockSymlink", func(t *testing.T) { hostileRootLock(t, node, py, "ln -s %s agent.lock") })
	t.Run("LockFIFO", func(t *testing.T) { hostileRootLock(t, node, py, "mkfifo agent.lock") })
}

// hostileRootCanary makes a root-owned file outside reft that no attack
// may change, and returns its path and a check.
func hostileRootCanary(t *testing.T, content string, mode os.FileMode) (string, func()) {
	t.Helper()
	p := filepath.Join(sharedDir(t, root), "canary")
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	os.Chmod(p, mode)
	return p, func() {
		t.Helper()
		b, err := os.ReadFile(p)
		fi, serr := os.Stat(p)
		if err != nil || string(b) != content || serr != nil || fi.Mode().Perm() != mode {
			t.Errorf("canary %s changed: %q (%v), mode %v (%v)", p, b, err, fi.Mode(), serr)
		}
	}
}

// hostileRootOn runs a shell command as who in a job of its own on node
// and returns the job id it ran in.
func hostileRootOn(t *testing.T, who, node, script string) (string, result) {
	t.Helper()
	r := run(t, 2*time.Minute, who, "srun", "-N1", "-n1", "-w", node, "sh", "-c", "echo job=$SLURM_JOB_ID; "+script)
	m := regexp.MustCompile(`job=(\d+)`).FindStringSubmatch(r.Stdout)
	if m == nil {
		t.Fatalf("%s's step on %s printed no job id:\n%s", who, node, r)
	}
	return m[1], r
}

// hostileRootNextJobs is the next few job ids after job: what an attacker
// plants for.
func hostileRootNextJobs(t *testing.T, job string) []string {
	n, err := strconv.Atoi(job)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := 1; i <= 8; i++ {
		ids = append(ids, strconv.Itoa(n+i))
	}
	return ids
}

// hostileRootNotDrained fails the test if node is drained or down.
func hostileRootNotDrained(t *testing.T, node string) {
	t.Helper()
	st := strings.TrimSpace(run(t, time.Minute, root, "sinfo", "-h", "-n", node, "-o", "%t").Stdout)
	if st == "" || strings.Contains(st, "drain") || strings.Contains(st, "drng") || strings.Contains(st, "down") || strings.HasSuffix(st, "*") {
		t.Errorf("node %s is %q after the attack", node, st)
	}
}

// hostileRootAliceWorks: alice's reft step on node runs and its agent
// answers.
func hostileRootAliceWorks(t *testing.T, node, py string) {
	t.Helper()
	r, job, hs := helloStep(t, node, py, "--reft=arc")
	if r.Code != 0 {
		t.Fatalf("alice's reft step failed:\n%s", r)
	}
	checkHellos(t, hs, 1, "arc", job, "0")
}

// hostileRootLogHas checks that the slurmd log gained exactly one line
// matching re (the attack's clear log line).
func hostileRootLogHas(t *testing.T, log func() string, re string) {
	t.Helper()
	var got []string
	rx := regexp.MustCompile(re)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		got = nil
		for _, l := range lines(log()) {
			if rx.MatchString(l) {
				got = append(got, l)
			}
		}
		if len(got) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(got) == 0 {
		t.Errorf("slurmd log has no line matching %q:\n%s", re, log())
	}
}

// Finding 1, store.tmpfs_root and agent.run_dir: both sit in the node's
// 1777 /dev/shm in the e2e configuration. bob plants them as symlinks to a
// root directory before any reft job ran. Before the fix, root created
// alice's directories through them (in the victim directory, owned by
// alice). Now root refuses, names the path in slurmd's log and in alice's
// step, and creates nothing; once bob's links are gone, alice's next step
// works.
func hostileRootStoreSquat(t *testing.T, node, py string) {
	victim := sharedDir(t, root)
	since := slurmdLogSince(t, node)
	_, r := hostileRootOn(t, bob, node, "ln -s "+victim+" /dev/shm/reft && ln -s "+victim+" /dev/shm/reft-run && ls -ld /dev/shm/reft /dev/shm/reft-run")
	if r.Code != 0 {
		t.Fatalf("bob could not plant the links (is this node's /dev/shm fresh?):\n%s", r)
	}
	t.Cleanup(func() { hostileRootOn(t, bob, node, "rm -f /dev/shm/reft /dev/shm/reft-run") })
	r = run(t, 2*time.Minute, alice, "srun", "-N1", "-n1", "-w", node, "--reft=arc", "/usr/bin/python3", py)
	if r.Code == 0 || !strings.Contains(r.Stderr, "/dev/shm/reft") || !strings.Contains(r.Stderr, "is a symlink") {
		t.Errorf("alice's step with a squatted store root: want a failure naming the symlink:\n%s", r)
	}
	hostileRootLogHas(t, since, `reft: job \d+: starting the reft agent .* /dev/shm/reft(-run)? is a symlink: refusing it`)
	if ents, err := os.ReadDir(victim); err != nil || len(ents) != 0 {
		t.Errorf("root created %v (%v) in %s through bob's link", ents, err, victim)
	}
	hostileRootOn(t, bob, node, "rm -f /dev/shm/reft /dev/shm/reft-run")
	hostileRootAliceWorks(t, node, py)
	hostileRootNotDrained(t, node)
}

// Finding 1, the marker: bob plants the plugin's old state directory
// (/dev/shm/.reft-spank) with <job>.spec.tmp -> a root file and
// <job>.spec -> a secret, for the next jobs, and tries the new one. Before
// the fix, the prolog wrote alice's SPEC into the canary (local root with
// /etc/ld.so.preload) and the extern step read the secret as the agent's
// SPEC. Now the state is in /run/reft/.plugin, root's only: bob cannot
// write there, and nothing of his is read or written.
func hostileRootPlantedState(t *testing.T, node, py string) {
	canary, check := hostileRootCanary(t, "canary\n", 0o644)
	secret, checkSecret := hostileRootCanary(t, "SECRET-"+strconv.FormatInt(time.Now().UnixNano(), 36)+"\n", 0o600)
	job, _ := hostileRootOn(t, bob, node, "true")
	var plant []string
	for _, j := range hostileRootNextJobs(t, job) {
		plant = append(plant, "ln -sf "+canary+" /dev/shm/.reft-spank/"+j+".spec.tmp", "ln -sf "+secret+" /dev/shm/.reft-spank/"+j+".spec")
	}
	_, r := hostileRootOn(t, bob, node, "mkdir /dev/shm/.reft-spank && chmod 777 /dev/shm/.reft-spank && "+strings.Join(plant, " && ")+
		" && echo planted"+
		"; mkdir /run/reft/.plugin/x 2>&1; ln -s "+canary+" /run/reft/.plugin/1.spec.tmp 2>&1; ls -ld /run/reft /run/reft/.plugin 2>&1; true")
	if !strings.Contains(r.Stdout, "planted") {
		t.Fatalf("bob could not plant /dev/shm/.reft-spank (is the node fresh?):\n%s", r)
	}
	if !strings.Contains(r.Stdout, "Permission denied") || strings.Contains(r.Stdout, "File exists") {
		t.Errorf("bob's attempts on /run/reft/.plugin: want Permission denied:\n%s", r)
	}
	if !regexp.MustCompile(`drwx------ +\d+ root +root .* /run/reft/.plugin`).MatchString(r.Stdout) {
		t.Errorf("/run/reft/.plugin is not root's 0700 directory:\n%s", r)
	}
	t.Cleanup(func() { hostileRootOn(t, bob, node, "rm -rf /dev/shm/.reft-spank") })
	since := slurmdLogSince(t, node)
	r, jobA, hs := helloStep(t, node, py, "--reft=arc")
	if r.Code != 0 {
		t.Fatalf("alice's step failed:\n%s\nslurmd log:\n%s", r, since())
	}
	checkHellos(t, hs, 1, "arc", jobA, "0")
	if strings.Contains(r.Stdout+r.Stderr+since(), "SECRET-") {
		t.Errorf("the secret reached alice or the log:\n%s\n%s", r, since())
	}
	check()
	checkSecret()
	hostileRootNotDrained(t, node)
}

// Finding 3: bob, in his own reft job, replaces his agent.lock with a FIFO
// (before the fix, the extern step's exit blocked opening it as root: the
// job stayed COMPLETING and the node drained) or a symlink to a root file
// (root opened it). Now the exit logs one line, the job ends at once, and
// the node takes alice's next job.
func hostileRootLock(t *testing.T, node, py, plant string) {
	target, check := hostileRootCanary(t, "canary\n", 0o600)
	if strings.Contains(plant, "%s") {
		plant = strings.ReplaceAll(plant, "%s", target)
	}
	job := allocateAs(t, bob, "--reft=arc", "-N1", "-w", node)
	since := slurmdLogSince(t, node)
	r := run(t, 2*time.Minute, bob, "srun", "--jobid="+job, "-N1", "-n1", "--reft=arc", "sh", "-c",
		"cd "+reftRunDir+"/"+job+" && rm -f agent.lock && "+plant+" && ls -l agent.lock")
	if r.Code != 0 {
		t.Fatalf("bob could not plant his lock:\n%s", r)
	}
	start := time.Now()
	mustRun(t, time.Minute, root, "scancel", job)
	if st := waitJob(t, job, 90*time.Second); !finalStates[strings.Fields(st + " ?")[0]] {
		t.Fatalf("bob's job is %s after scancel", st)
	}
	if d := time.Since(start); d > 45*time.Second {
		t.Errorf("bob's job took %s to end", d)
	}
	waitNoAgents(t, job)
	hostileRootLogHas(t, since, `reft: job `+job+` cleanup: .*agent\.lock (is not a regular file|is a symlink)`)
	check()
	hostileRootNotDrained(t, node)
	hostileRootAliceWorks(t, node, py)
}

// Finding 4, root side: bob pre-creates the next jobs' log directories in
// the shared 1777 log directory, mode 0777. Root (as the job's user) makes
// <log dir>/<job> 0700 for alice's agent; a squatted one is not used, and
// slurmd's log says so in one line.
func hostileRootLogSquat(t *testing.T, node, py string) {
	logDir := filepath.Join(clusterDir, "log", "reft")
	job, _ := hostileRootOn(t, bob, node, "true")
	var dirs []string
	for _, j := range hostileRootNextJobs(t, job) {
		dirs = append(dirs, filepath.Join(logDir, j))
	}
	mustRun(t, time.Minute, bob, "sh", "-c", "umask 0; mkdir "+strings.Join(dirs, " "))
	t.Cleanup(func() {
		run(t, time.Minute, bob, append([]string{"rm", "-rf"}, dirs...)...)
		run(t, time.Minute, root, "sh", "-c", "rm -rf "+logDir+"/.squatted-*")
	})
	since := slurmdLogSince(t, node)
	r, jobA, hs := helloStep(t, node, py, "--reft=arc")
	if r.Code != 0 {
		t.Fatalf("alice's step failed:\n%s\nslurmd log:\n%s", r, since())
	}
	checkHellos(t, hs, 1, "arc", jobA, "0")
	hostileRootLogHas(t, since, `reft: job `+jobA+`: the agent's log directory .*/`+jobA+` exists with owner uid `+strconv.Itoa(uidOf(t, bob))+` and mode 777, not the job's uid and 0700 \(planted by another user\?\): moved aside to \.squatted-`+jobA+`-`)
	// Root moved bob's directory aside: alice's job has its own, 0700,
	// and its agent logs there.
	fi, err := os.Lstat(filepath.Join(logDir, jobA))
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 || int(fi.Sys().(*syscall.Stat_t).Uid) != uidOf(t, alice) {
		t.Fatalf("alice's log directory %s/%s: %v, %v; want her own 0700 directory", logDir, jobA, fi, err)
	}
	hostileRootNotDrained(t, node)
}

// Finding 7: the agent keeps the job's supplementary groups (alice is in
// reft-project), so a persist_dir shared through a project group works.
func hostileRootGroups(t *testing.T, node string) {
	g, err := user.LookupGroup("reft-project")
	if err != nil {
		t.Fatalf("group reft-project (the cluster tool adds alice to it): %v", err)
	}
	job := allocate(t, "--reft=arc", "-N1", "-w", node)
	r := mustRun(t, 2*time.Minute, alice, "srun", "--jobid="+job, "-N1", "-n1", "--reft=arc", "id", "-G")
	if !strings.Contains(" "+strings.TrimSpace(r.Stdout)+" ", " "+g.Gid+" ") {
		t.Fatalf("alice's task is not in reft-project (%s): %s", g.Gid, r.Stdout)
	}
	pids := agentPIDs(t, job)[node]
	if len(pids) != 1 {
		t.Fatalf("agents of job %s on %s: %v", job, node, pids)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pids[0]) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^Groups:\s*(.*)$`).FindStringSubmatch(string(b))
	if m == nil || !strings.Contains(" "+m[1]+" ", " "+g.Gid+" ") {
		t.Errorf("agent %d of alice's job lacks reft-project (%s): Groups: %v", pids[0], g.Gid, m)
	}
}

// Finding 8: a job of root with --reft fails at once, with why and what to
// do, at submission (srun, sbatch) instead of waiting out
// agent.start_timeout on the node.
func hostileRootJob(t *testing.T, node string) {
	const want = "jobs of root cannot use reft"
	for _, args := range [][]string{
		{"srun", "-N1", "-w", node, "--reft=arc", "true"},
		{"sbatch", "-N1", "-w", node, "--reft=arc", "--wrap", "true"},
	} {
		start := time.Now()
		r := run(t, time.Minute, root, args...)
		if r.Code == 0 || !strings.Contains(r.Stderr, want) || !strings.Contains(r.Stderr, "regular user") {
			t.Errorf("%s as root: want a refusal saying %q and what to do:\n%s", args[0], want, r)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("%s as root took %s to fail (agent.start_timeout is 20 s)", args[0], d)
		}
	}
	// Without --reft, root's jobs are unaffected.
	if r := run(t, time.Minute, root, "srun", "-N1", "-w", node, "true"); r.Code != 0 {
		t.Errorf("root's job without --reft failed:\n%s", r)
	}
}
