package detect

import (
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func TestHangTimeout(t *testing.T) {
	for _, tc := range []struct {
		name     string
		floor    time.Duration
		factor   float64
		stepTime time.Duration
		want     time.Duration
	}{
		{"no median yet: the floor", time.Minute, 10, 0, time.Minute},
		{"fast steps: the floor", time.Minute, 10, 100 * time.Millisecond, time.Minute},
		{"slow steps raise it", time.Minute, 10, 30 * time.Second, 5 * time.Minute},
		{"factor 0: the floor alone", time.Minute, 0, time.Hour, time.Minute},
		{"exactly at the floor", time.Minute, 2.5, 24 * time.Second, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := HangTimeout(tc.floor, tc.factor, tc.stepTime); got != tc.want {
				t.Errorf("HangTimeout(%s, %g, %s) = %s, want %s", tc.floor, tc.factor, tc.stepTime, got, tc.want)
			}
		})
	}
}

// setProgress gives node's agent one rank's progress.
func (j *testJob) setProgress(node string, ps ...Progress) {
	a := j.agents[node]
	a.mu.Lock()
	a.progress = ps
	a.mu.Unlock()
}

// TestHangFrozenRankNamed: one rank of a synchronous job is stopped
// (SIGSTOP) and the others, their processes asleep, wait for it in a
// collective. Every rank stops progressing at once; only the stopped one
// is named, by its own agent, in one verdict; the waiting ranks' agents
// say they wait and report nothing once the verdict is published, even
// past twice the timeout.
func TestHangFrozenRankNamed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hang := 2 * tTimeout
		j := newJob(t, 3, map[string]time.Duration{"n1": hang, "n2": hang, "n3": hang})
		now := time.Now()
		j.setProgress("n1", Progress{Rank: 0, Step: 12, At: now, Process: ProcSleeping})
		j.setProgress("n2", Progress{Rank: 5, Step: 12, At: now, Process: ProcStopped, Where: "in the collective gradient all-reduce"})
		j.setProgress("n3", Progress{Rank: 9, Step: 12, At: now, Process: ProcSleeping, Where: "in a communication phase"})
		got, events := j.published(1)
		time.Sleep(3 * hang) // past twice the timeout: a waiting rank would be reported by now
		for _, a := range j.survivors() {
			got[a.name] = a.failures()
		}
		for name, fs := range got {
			if len(fs) != 1 || fs[0].Class != ClassHang || fs[0].Node != "n2" || !slices.Equal(fs[0].Ranks, []int{5}) {
				t.Errorf("%s learnt %+v; want one hang of rank 5 on n2", name, fs)
			}
		}
		if want := "rank 5 at step 12, process stopped, last seen in the collective gradient all-reduce, silent "; len(events) != 1 || !strings.Contains(events[0]["message"].(string), want) {
			t.Errorf("failure_detected events %v; want one saying %q", events, want)
		}
		for _, n := range []string{"n1", "n3"} {
			if h := j.agents[n].log.Events("rank_hung"); len(h) != 0 {
				t.Errorf("%s reported its waiting rank as hung: %v", n, h)
			}
		}
	})
}

// TestHangAllWaiting: every rank waits and none is frozen (a deadlock in
// the collectives, or a rank stuck in its own computation): nobody is named
// at the timeout, and at twice it the ranks are reported anyway, so the job
// is relaunched rather than left to burn its allocation.
func TestHangAllWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hang := 2 * tTimeout
		j := newJob(t, 2, map[string]time.Duration{"n1": hang, "n2": hang})
		start := time.Now()
		j.setProgress("n1", Progress{Rank: 0, Step: 3, At: start, Process: ProcRunning})
		j.setProgress("n2", Progress{Rank: 1, Step: 3, At: start, Process: ProcSleeping, Where: "in the collective gradient all-reduce"})
		time.Sleep(hang + hang/2)
		for _, a := range j.survivors() {
			if fs := a.failures(); len(fs) != 0 {
				t.Fatalf("%s learnt %+v before twice the timeout; want nothing yet", a.name, fs)
			}
			if w := a.log.Events("rank_waiting"); len(w) != 1 {
				t.Errorf("%s logged %d rank_waiting events, want 1: %v", a.name, len(w), w)
			} else if a.name == "n2" && (w[0]["where"] != "in the collective gradient all-reduce" ||
				!strings.Contains(w[0]["message"].(string), "its process is sleeping, last seen in the collective gradient all-reduce: it waits")) {
				t.Errorf("n2's rank_waiting event %v; want it to say where rank 1 waits", w[0])
			}
		}
		got, _ := j.published(1)
		for name, fs := range got {
			for _, f := range fs {
				if f.Class != ClassHang || !strings.Contains(f.Cause, "no other rank named") || f.DetectedAt.Sub(start) < 2*hang {
					t.Errorf("%s learnt %+v; want hangs of waiting ranks, after %s", name, f, 2*hang)
				}
			}
		}
	})
}

// TestHangAdaptive: a rank whose steps take 400 ms is stopped; with
// hang_factor 10 its timeout is 4 s, above the 2 s floor, so nothing is
// said at the floor (a slow step would be there) and the verdict names
// the measure.
func TestHangAdaptive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hang := 2 * tTimeout
		hangs := map[string]time.Duration{"n1": hang, "n2": hang}
		j := newJobFactor(t, 2, nil, hangs, 10, tInterval, tTimeout, tConfirm)
		start := time.Now()
		j.setProgress("n2", Progress{Rank: 1, Step: 30, At: start, StepTime: 400 * time.Millisecond, Process: ProcStopped})
		time.Sleep(3 * time.Second) // past the floor, short of 10 x 400 ms
		for _, a := range j.survivors() {
			if fs := a.failures(); len(fs) != 0 {
				t.Fatalf("%s learnt %+v 3 s after the last progress; want nothing before 4 s", a.name, fs)
			}
		}
		got, _ := j.published(1)
		for name, fs := range got {
			if len(fs) != 1 || !strings.Contains(fs[0].Cause, "timeout 4s: 10 x its median step 400ms") || fs[0].DetectedAt.Sub(start) < 4*time.Second {
				t.Errorf("%s learnt %+v; want one hang after 4 s naming 10 x its median step 400ms", name, fs)
			}
		}
	})
}

// TestHangZombie: a rank that exited and is not reaped (a zombie) is
// reported at its timeout when nothing explains it, but not when a verdict
// published after its last progress does: the job's teardown kills the
// ranks that waited for the hung one, and a rank killed then is no second
// hang (seen in TestReftRunHangTorch: rank 3 reported 0.13 s after rank
// 2's verdict).
func TestHangZombie(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stopped bool // rank 5 on n2 is stopped first, and its hang published
		want    []string
	}{
		{"alone", false, []string{"n3"}},
		{"after another rank's verdict", true, []string{"n2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				hang := 2 * tTimeout
				j := newJob(t, 3, map[string]time.Duration{"n1": hang, "n2": hang, "n3": hang})
				now := time.Now()
				j.setProgress("n1", Progress{Rank: 0, Step: 12, At: now, Process: ProcSleeping})
				if tc.stopped {
					j.setProgress("n2", Progress{Rank: 5, Step: 12, At: now, Process: ProcStopped})
					j.setProgress("n3", Progress{Rank: 9, Step: 12, At: now, Process: ProcSleeping})
					j.published(1)
				} else {
					j.setProgress("n2", Progress{Rank: 5, Step: 12, At: now, Process: ProcSleeping})
				}
				j.setProgress("n3", Progress{Rank: 9, Step: 12, At: now, Process: ProcZombie})
				time.Sleep(3 * hang / 2) // past the timeout, before a waiting rank's twice it
				var nodes []string
				for _, a := range j.survivors() {
					for _, f := range a.failures() {
						if a.name == "n1" && f.Class == ClassHang {
							nodes = append(nodes, f.Node)
						}
					}
				}
				if !slices.Equal(nodes, tc.want) {
					t.Errorf("n1 learnt hangs on %v, want %v", nodes, tc.want)
				}
			})
		})
	}
}
