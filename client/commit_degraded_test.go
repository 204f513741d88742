package client_test

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reft-hpc/reft/client"
	"github.com/reft-hpc/reft/tests/conformance-agent/agenttest"
)

// TestCommitSaysDegraded: an agent whose protection falls short of its
// SPEC (this one has no peering, under arc) says so in its commit replies
// once the grace is over, and the client says it once, however many
// commits follow.
func TestCommitSaysDegraded(t *testing.T) {
	a := startAgentWith(t, agenttest.Options{DegradedGrace: time.Nanosecond})
	var mu sync.Mutex
	var said []string
	c := open(t, a, client.Options{ChunkSize: 4096, Log: func(msg string) { mu.Lock(); said = append(said, msg); mu.Unlock() }})
	if err := c.Register("w", patterned(10000, 1), client.Replicated); err != nil {
		t.Fatal(err)
	}
	for step := int64(1); step <= 4; step++ {
		if err := c.Save(step).Wait(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	var warned []string
	for _, m := range said {
		if strings.Contains(m, "less protected than the SPEC asks") {
			warned = append(warned, m)
		}
	}
	if len(warned) != 1 || !strings.Contains(warned[0], "(peering, rank_local)") {
		t.Errorf("the client said %q; want one warning naming peering and rank_local (no peering, one rank)", said)
	}
}

// TestCommitStrictRefuses: under a strict SPEC the agent refuses a commit
// once the protection has fallen short for the grace: the save fails with
// CodeDegraded, saying why and how out, and the step committed before it
// stays.
func TestCommitStrictRefuses(t *testing.T) {
	a := startAgentWith(t, agenttest.Options{Spec: "arc,strict", DegradedGrace: time.Nanosecond})
	c := open(t, a, client.Options{ChunkSize: 4096, Log: func(string) {}})
	if err := c.Register("w", patterned(10000, 1), client.Replicated); err != nil {
		t.Fatal(err)
	}
	if err := c.Save(1).Wait(ctxT(t)); err != nil {
		t.Fatalf("the first commit, inside the grace: %v", err)
	}
	err := c.Save(2).Wait(ctxT(t))
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Code != "degraded" || !strings.Contains(err.Error(), "strict") || !strings.Contains(err.Error(), "(peering, rank_local)") {
		t.Fatalf("the second commit: %v; want a client.Error with code degraded naming strict and the reasons", err)
	}
	gens, err := c.Generations(ctxT(t))
	if err != nil || len(gens) != 1 || gens[0] != 1 {
		t.Fatalf("generations %v, %v; want step 1 alone", gens, err)
	}
}
