package agent

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/metrics"
)

// TestCarryMetrics: a job's agents on a node carry their counters over
// (reft run restarts the survivors' agents after a node loss): a failure
// counted by one agent, saved at its verdict's kick, is counted by the
// next one even if the first never stopped cleanly; a carry file it
// cannot use is said and not used.
func TestCarryMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		var logs bytes.Buffer
		log := zerolog.New(&logs)

		first := metrics.NewRecorder()
		ctx, stop := context.WithCancel(t.Context())
		kick := make(chan struct{}, 1)
		done := carryMetrics(ctx, dir, "7", "n1", first, kick, log)
		first.Failure("node", 0.5)
		kick <- struct{}{}
		synctest.Wait() // the kicked save is done, before any stop
		d, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		saved, err := metrics.ReadCarry(d, "7", "n1")
		d.Close()
		if err != nil || saved == nil || saved.FailuresDetected["node"] != 1 {
			t.Fatalf("after the verdict's kick the carry holds %+v (%v), want the node failure: an agent SIGKILLed now would lose it", saved, err)
		}
		stop()
		<-done

		second := metrics.NewRecorder()
		ctx2, stop2 := context.WithCancel(t.Context())
		done2 := carryMetrics(ctx2, dir, "7", "n1", second, nil, log)
		if got := second.Status().FailuresDetected["node"]; got != 1 {
			t.Errorf("the next agent counts %d node failures, want the first agent's 1", got)
		}
		if !strings.Contains(logs.String(), "metrics_carried") {
			t.Errorf("no metrics_carried event logged: %s", logs.String())
		}
		second.Failure("hang", 2)
		stop2()
		<-done2 // its save at the stop
		d, _ = os.Open(dir)
		saved, err = metrics.ReadCarry(d, "7", "n1")
		d.Close()
		if err != nil || saved.FailuresDetected["node"] != 1 || saved.FailuresDetected["hang"] != 1 {
			t.Errorf("the second agent left %+v (%v), want its own hang and the carried node failure", saved, err)
		}

		os.Remove(filepath.Join(dir, metrics.CarryName))
		if err := os.WriteFile(filepath.Join(dir, metrics.CarryName), []byte(`{"version":1,"job":"8","node":"n1","metrics":{}}`), 0o600); err != nil {
			t.Fatal(err)
		}
		logs.Reset()
		third := metrics.NewRecorder()
		ctx3, stop3 := context.WithCancel(t.Context())
		done3 := carryMetrics(ctx3, dir, "7", "n1", third, nil, log)
		if got := third.Status().FailuresDetected; got["node"] != 0 || got["hang"] != 0 {
			t.Errorf("an agent given another job's carry counts %v, want zero", got)
		}
		if !strings.Contains(logs.String(), `not job \"7\"`) || !strings.Contains(logs.String(), "start from zero") {
			t.Errorf("the unusable carry was not said with why: %s", logs.String())
		}
		stop3()
		<-done3
	})
}
