//go:build e2e && e2enet

// Issue 18's network faults, on a test cluster brought up with its own
// networks (tests/cluster/cluster up --net):
//
//	tests/cluster/cluster up --net --no-reft && go test -tags 'e2e e2enet' -run Net ./tests/e2e/
package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

var relayedRe = regexp.MustCompile(`relayed (\d+) frames from the node`)

// needNet fails the test unless the cluster runs with --net.
func needNet(t *testing.T) {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join(clusterDir, "etc", "net")); err != nil || strings.TrimSpace(string(b)) != "netns" {
		t.Fatalf("this test needs the test cluster's own networks: bring it up with 'tests/cluster/cluster up --net --no-reft' (%v)", err)
	}
}

// TestNetFaultsNoVerdict: a fault shorter than the detector's watch window
// (a 3 s flap of n2, a 3 s stall of n3's every process), or one that only
// slows a node (200 ms added to n2's every round trip, held while the job
// trains ten steps through it), costs no verdict and no relaunch: the job
// completes with an uninterrupted run's bits, the recovery log shows one
// launch and the completion, and no agent logged a failure.
func TestNetFaultsNoVerdict(t *testing.T) {
	needNet(t)
	enableReft(t)
	flags := append(append([]string{}, trainFlags...), reftTrainFlags...)
	flags = append(flags, "--steps", "60")
	refHash := reference(t, flags)
	for _, tc := range []struct {
		name  string
		fault []string // cluster command
		at    int      // the step after which the fault starts
		// With through, the fault lasts while the job trains that many
		// more steps, and undo ends it (else the fault command ends it
		// itself).
		through int
		undo    []string
	}{
		{name: "3 s flap of n2", fault: []string{"flap", "n2", "3"}, at: 20},
		{name: "3 s stall of n3", fault: []string{"stall", "n3", "3"}, at: 20},
		// Early: the job must still be training once the delay is on.
		{name: "200 ms delay on n2", fault: []string{"delay", "n2", "200"}, at: 5, through: 10, undo: []string{"delay", "n2", "0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// On n1-n4, so that the faulted node is the job's (-N4 alone
			// may leave out a node still completing the last job: the
			// first delay run did, and its frames never went through the
			// delay line).
			job, dir := reftRunJobWith(t, "-N4 -w n[1-4] --reft=arc --requeue", flags...)
			defer func() { netResult(t, tc.name, nil, job, time.Time{}, !t.Failed(), "n1", "n2", "n3", "n4") }()
			waitOutput(t, dir, job, fmt.Sprintf("\nstep %d loss", tc.at))
			if tc.undo != nil {
				t.Cleanup(func() { cluster(t, tc.undo...) })
			}
			cluster(t, tc.fault...)
			if tc.through > 0 {
				// Training goes on through the fault: the next steps with it.
				m := lossRe.FindAllStringSubmatch(jobOutput(t, dir, job), -1)
				last, _ := strconv.Atoi(m[len(m)-1][1])
				if last+tc.through >= 60 {
					t.Fatalf("the job was at step %d of 60 when %v took effect: too late to train %d steps through it", last, tc.fault, tc.through)
				}
				waitOutput(t, dir, job, fmt.Sprintf("\nstep %d loss", last+tc.through))
				cluster(t, tc.undo...)
			}
			if tc.fault[0] == "delay" {
				// The job's traffic really went through the delay line.
				b, _ := os.ReadFile(filepath.Join(clusterDir, "log", "delay-"+tc.fault[1]+".log"))
				if m := relayedRe.FindSubmatch(b); m == nil || string(m[1]) == "0" {
					t.Errorf("the delay line relayed no frame from %s:\n%s", tc.fault[1], b)
				}
			}
			waitJobEnd(t, job, 5*time.Minute)
			completedSame(t, dir, job, refHash)
			if names := eventNames(recoveryEvents(t, job)); !slices.Equal(names, []string{"step_launched", "completed"}) {
				t.Errorf("recovery events %v, want a launch and the completion only", names)
			}
			if af := agentsFailures(t, job, "n1", "n2", "n3", "n4"); len(af) != 0 {
				t.Errorf("the agents published %v, want no failure", af)
			}
		})
	}
}

// TestNetPartitionFromAgents: n2 is cut off from every other node but not
// from slurmctld, for good. The other agents make a quorum and publish
// n2's loss, one verdict, never one about n2's neighbours, and n2's own
// agent publishes nothing; reft run takes the verdict (its quorum outweighs
// Slurm still calling n2 healthy) and acts on n2 alone: the spare n5 takes
// its slot, and the job ends with an uninterrupted run's bits.
func TestNetPartitionFromAgents(t *testing.T) {
	nl, refHash := partitionN2(t, func() { cluster(t, "heal", "n2"); reviveIfDead(t, "n2") }, "--from", "n1,n3,n4,n5")
	defer func() {
		netResult(t, "n2 cut off from the other nodes, not from slurmctld", []string{"n2"}, nl.job, nl.killed, !t.Failed(), "n1", "n2", "n3", "n4", "n5")
	}()
	checkQuorumOnN2(t, nl, refHash)
}

// TestNetPartitionFromAll: n2 is cut off from everything, slurmctld
// included, for good, its processes running on: a live node that no one
// can reach, not a dead one. The other agents make a quorum and publish
// n2's loss, one verdict; n2's own agent, alone, reaches no quorum and
// fences itself (detect_fenced) rather than condemn the others; reft run
// acts on n2 alone: the spare n5 takes its slot and the job ends with an
// uninterrupted run's bits. Healed afterwards, n2 comes back to Slurm.
func TestNetPartitionFromAll(t *testing.T) {
	nl, refHash := partitionN2(t, func() { healAndWaitUp(t, "n2") })
	defer func() {
		netResult(t, "n2 cut off from everything, slurmctld included", []string{"n2"}, nl.job, nl.killed, !t.Failed(), "n1", "n2", "n3", "n4", "n5")
	}()
	checkQuorumOnN2(t, nl, refHash)
	if f := agentEvents(t, nl.job, "n2")["detect_fenced"]; len(f) == 0 {
		t.Errorf("n2's agent, alone, never fenced itself (no detect_fenced event)")
	} else {
		t.Logf("n2's agent: %v", f[0]["message"])
	}
}

// partitionN2 runs the partition scenarios' job: -N5 with a spare, DP=4
// on n1-n4, and n2 partitioned (`cluster partition n2 partArgs...`) for
// good once rank 0 logged step 30. heal brings n2 back before each try
// and when the test ends. It returns the run and the uninterrupted run's
// hash.
func partitionN2(t *testing.T, heal func(), partArgs ...string) (spareLoss, string) {
	t.Helper()
	needNet(t)
	enableReft(t)
	flags := append(append([]string{}, trainFlags...), reftTrainFlags...)
	flags = append(flags, "--steps", "150")
	refHash := reference(t, flags)
	t.Cleanup(heal)
	var nl spareLoss
	untilNoInitCrash(t, func() (string, string) {
		heal()
		job, dir := reftRunCmd(t, "-N5 --no-kill --reft=arc,spares=1 --requeue", bin("reft-train")+" "+strings.Join(append(flags, "--dp", "4"), " "))
		nl = spareLoss{job: job, dir: dir, killStep: 30}
		waitOutput(t, dir, job, "\nstep 30 loss")
		stop := watchFirstStep(dir, job, &nl)
		cluster(t, append([]string{"partition", "n2"}, partArgs...)...)
		nl.killed = time.Now()
		waitJobEnd(t, job, 5*time.Minute)
		stop()
		return job, dir
	})
	return nl, refHash
}

// checkQuorumOnN2 checks a partition of n2: the node-loss story with the
// spare in n2's place and the uninterrupted run's bits (checkNodeLossSpare),
// the verdict the other agents' quorum's, and nothing published by n2.
func checkQuorumOnN2(t *testing.T, nl spareLoss, refHash string) {
	t.Helper()
	ev := checkNodeLossSpare(t, nl, refHash)
	if !strings.Contains(ev[1].Cause, "a quorum") {
		t.Errorf("failure_detected cause %q does not name the agents' quorum", ev[1].Cause)
	}
	if af := agentsFailures(t, nl.job, "n2"); len(af) != 0 {
		t.Errorf("n2, cut off, published %v; want nothing", af)
	}
}

// healAndWaitUp heals node's partitions and waits until Slurm schedules
// on it again (idle, or running something: ReturnToService=2 takes it
// back once it re-registers; a state with a flag such as "*", not
// responding, or down, drained, completing, is not back yet), so that the
// next scenario starts with every node.
func healAndWaitUp(t *testing.T, node string) {
	t.Helper()
	cluster(t, "heal", node)
	reviveIfDead(t, node)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st := strings.TrimSpace(run(t, 30*time.Second, root, "sinfo", "-h", "-n", node, "-o", "%t").Stdout)
		if st == "idle" || st == "mix" || st == "alloc" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is %q 2 min after it was healed, want it back in service:\n%s\n%s", node, st,
				run(t, 30*time.Second, root, "scontrol", "show", "node", node).Stdout, run(t, 30*time.Second, root, "squeue", "-w", node).Stdout)
		}
		time.Sleep(time.Second)
	}
}
