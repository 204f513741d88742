package agent

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

type fakeJob struct {
	states []string // returned in turn; the last repeats
	gone   bool
	err    error
	calls  atomic.Int32
}

func (f *fakeJob) JobState(context.Context) (string, bool, error) {
	n := int(f.calls.Add(1)) - 1
	if f.err != nil {
		return "", false, f.err
	}
	return f.states[min(n, len(f.states)-1)], f.gone, nil
}

func TestWatchJob(t *testing.T) {
	for name, tc := range map[string]struct {
		job   *fakeJob
		stops bool
		log   string
	}{
		"completed after running":      {&fakeJob{states: []string{"RUNNING", "RUNNING", "COMPLETED"}}, true, `"job_state":"COMPLETED"`},
		"requeued":                     {&fakeJob{states: []string{"PENDING"}}, true, `"job_state":"PENDING"`},
		"purged from slurmctld":        {&fakeJob{states: []string{""}, gone: true}, true, "unknown to slurmctld"},
		"running and resizing":         {&fakeJob{states: []string{"RUNNING", "RESIZING", "RUNNING"}}, false, ""},
		"scontrol failing (warn once)": {&fakeJob{err: errors.New("slurmctld down")}, false, "job_watch_error"},
	} {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stopped, exited := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(exited)
				watchJob(ctx, func() { close(stopped) }, tc.job, time.Millisecond, zerolog.New(&buf))
			}()
			// Enough polls to see every scripted state.
			for tc.job.calls.Load() < 6 {
				select {
				case <-stopped:
					goto done
				default:
					time.Sleep(time.Millisecond)
				}
			}
		done:
			select {
			case <-stopped:
				if !tc.stops {
					t.Fatal("the agent stopped while its job runs")
				}
			default:
				if tc.stops {
					t.Fatal("the agent kept running after its job ended")
				}
			}
			cancel()
			<-exited
			if tc.log != "" && strings.Count(buf.String(), tc.log) != 1 {
				t.Fatalf("want one %q line, log:\n%s", tc.log, buf.String())
			}
		})
	}
}
