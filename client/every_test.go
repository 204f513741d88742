package client_test

import (
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/client"
	"github.com/reft-hpc/reft/tests/conformance-agent/agenttest"
)

// TestEvery: the client reads every= from the agent's hello reply; under
// every=0 Save keeps nothing (no generation) but reports the step as
// progress, says so once, and the JIT flush still saves the live state.
func TestEvery(t *testing.T) {
	for _, tc := range []struct {
		spec  string
		every int
	}{{"arc", 1}, {"arc,every=4", 4}, {"arc+aec,every=0", 0}} {
		t.Run(tc.spec, func(t *testing.T) {
			ab := &syncBuf{}
			a := startAgentWith(t, agenttest.Options{Spec: tc.spec, Log: zerolog.New(ab).Level(zerolog.DebugLevel)})
			r := &jitRank{a: a, buf: make([]byte, 64<<10), log: &lineLog{}, agnt: ab}
			r.c = open(t, a, client.Options{Log: r.log.log, ChunkSize: 16 << 10})
			if got := r.c.Every(); got != tc.every {
				t.Fatalf("Every() = %d under %s, want %d", got, tc.spec, tc.every)
			}
			if err := r.c.Register("state", r.buf, client.Replicated); err != nil {
				t.Fatal(err)
			}
			for s := int64(1); s <= 3; s++ {
				r.step(s)
				r.save(t, s)
			}
			gens, err := r.c.Generations(ctxT(t))
			if err != nil {
				t.Fatal(err)
			}
			said := strings.Count(r.log.all(), "every=0 (")
			if tc.every != 0 {
				if len(gens) == 0 || said != 0 {
					t.Fatalf("every=%d: generations %v, every=0 lines %d; want saves and no line", tc.every, gens, said)
				}
				return
			}
			if len(gens) != 0 || committedCount(ab) != 0 {
				t.Fatalf("every=0: Save kept generations %v (%d commits); want none", gens, committedCount(ab))
			}
			if said != 1 {
				t.Errorf("every=0: the notice was said %d times, want once:\n%s", said, r.log.all())
			}
			// The flush saves the live state, step 3, and it restores.
			step, saved, err := r.c.Flush(ctxT(t), "test")
			if err != nil || step != 3 || !saved {
				t.Fatalf("every=0: Flush = %d, %v, %v; want 3, true, nil", step, saved, err)
			}
			// Step 4's Save is a heartbeat: the agent sees the rank at step
			// 4 (its status lists a rank once it has a generation).
			r.step(4)
			r.save(t, 4)
			st := a.Status()
			if len(st.Ranks) != 1 || st.Ranks[0].Newest != 3 || st.Ranks[0].Progress == nil || st.Ranks[0].Progress.Step != 4 {
				t.Errorf("every=0: the agent's status of the rank is %+v, want generation 3 and progress at step 4 (Save's heartbeat)", st.Ranks)
			}
			r.checkRestores(t, 3)
		})
	}
}

// TestJITInterruptsUpdate: a flush that finds the trainer updating calls
// the interrupt set with SetUpdateInterrupt, once; the trainer undoes its
// update and declares the previous step consistent again, and the flush
// saves that step instead of waiting out its deadline.
func TestJITInterruptsUpdate(t *testing.T) {
	r := newJITRank(t, 0)
	asked := make(chan struct{}, 4)
	r.c.SetUpdateInterrupt(func() { asked <- struct{}{} })
	r.step(7)
	r.c.Updating() // inside step 8's update, which only the interrupt ends
	undone := make(chan struct{})
	go func() {
		defer close(undone)
		<-asked
		r.c.Consistent(7) // the update undone: the buffer is step 7's again
	}()
	step, saved, err := r.c.Flush(ctxT(t), "test")
	<-undone
	if err != nil || step != 7 || !saved {
		t.Fatalf("Flush = %d, %v, %v; want 7, true, nil", step, saved, err)
	}
	if len(asked) != 0 {
		t.Errorf("the interrupt was called %d more times; want once per flush", len(asked))
	}
	r.checkRestores(t, 7)
}

// TestEvery0FixesRingAtHeartbeat: under every=0 the agent fixes a sharding
// group's ring at the ranks' heartbeats (their Saves), not at a first
// save, which would be the JIT flush after a failure, when a dead member
// can no longer register.
func TestEvery0FixesRingAtHeartbeat(t *testing.T) {
	ab := &syncBuf{}
	a := startAgentWith(t, agenttest.Options{Spec: "arc,every=0", Log: zerolog.New(ab).Level(zerolog.DebugLevel)})
	errs := make(chan error, 2)
	for r := range 2 {
		c := open(t, a, client.Options{Rank: r, World: 2, LocalRank: r, Layout: "dp=2,pp=1", Log: func(string) {}})
		if err := c.Register("weights", make([]byte, 64<<10), client.Replicated); err != nil {
			t.Fatal(err)
		}
		go func() { errs <- c.Save(1).Wait(ctxT(t)) }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if rings := ab.Events("sg_ring"); len(rings) != 1 || committedCount(ab) != 0 {
		t.Fatalf("after the heartbeats: %d sg_ring events, %d commits; want the ring fixed once, nothing committed", len(rings), committedCount(ab))
	}
}
