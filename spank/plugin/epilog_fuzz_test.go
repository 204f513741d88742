package main

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// FuzzParseJobFields: the job epilog runs as root and reads `scontrol -o
// show job`, whose line carries the user's own text (job name, comment,
// work directory). Whatever it holds, the parser never panics, accepts only
// the line of the job asked for, with a state, and its errors stay on one
// line (they go to slurmd's log); runsAgain then decides or errs.
func FuzzParseJobFields(f *testing.F) {
	f.Add("JobId=42 JobName=train UserId=alice(1001) JobState=COMPLETING Reason=None Restarts=0 BatchFlag=1\n", 3)
	f.Add("JobId=41 JobState=RUNNING\nJobId=42 JobName=x JobState=COMPLETING Restarts=2\n", 1)
	f.Add("JobId=42 JobName=a JobState=PENDING Restarts=1 JobState=COMPLETING\n", 0)
	f.Add("JobId=42 Restarts=-1 JobState=COMPLETING", 5)
	f.Add("JobId=42 JobState= Restarts=99999999999999999999\n", 0)
	f.Add("JobId=420 JobState=COMPLETING\n\n", 0)
	f.Fuzz(func(t *testing.T, out string, runs int) {
		fields, err := parseJobFields(out, "42")
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		if fields["JobId"] != "42" || fields["JobState"] == "" {
			t.Fatalf("accepted fields %v for job 42", fields)
		}
		count := func(context.Context) (int, error) {
			if runs < 0 {
				return 0, errors.New("no accounting")
			}
			return runs, nil
		}
		again, why, err := runsAgain(context.Background(), fields, count)
		if err == nil && why == "" {
			t.Fatalf("runsAgain(%v) = %v with no reason", fields, again)
		}
		if err != nil && again {
			t.Fatalf("runsAgain(%v) kept the store and failed: %v", fields, err)
		}
	})
}
