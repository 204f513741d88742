package gc

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzSlurm: `reft gc` (root) decides what to delete from squeue and
// scontrol output; whatever they print, List and Show never panic, and
// the jobs they return have whitespace-free ids and states.
func FuzzSlurm(f *testing.F) {
	f.Add("201 RUNNING\n202 COMPLETED\n\n 203   PENDING \n", "JobId=201 JobName=train UserId=alice(1000) JobState=NODE_FAIL Reason=None Requeue=1 Restarts=0")
	f.Add("201 RUNNING extra\n", "JobName=JobState=RUNNING Requeue=1")
	f.Add("", "JobState= Requeue=0\n")
	f.Add("a\tb\r\n", "Comment=x JobState=RUNNING JobState=COMPLETED")
	dir := f.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\ncat \""+p+".out\"\n"+body), 0o755); err != nil {
			f.Fatal(err)
		}
		return p
	}
	s := Slurm{Squeue: write("squeue", ""), Scontrol: write("scontrol", "")}
	f.Fuzz(func(t *testing.T, squeue, scontrol string) {
		for p, out := range map[string]string{s.Squeue: squeue, s.Scontrol: scontrol} {
			if err := os.WriteFile(p+".out", []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		field := func(what, v string) {
			if v == "" || strings.ContainsAny(v, " \t\n\r\v\f") {
				t.Fatalf("%s %q", what, v)
			}
		}
		if jobs, err := s.List(context.Background()); err == nil {
			for id, j := range jobs {
				if j.ID != id {
					t.Fatalf("job %q filed as %q", j.ID, id)
				}
				field("job id", id)
				field("state", j.State)
			}
		}
		if j, ok, err := s.Show(context.Background(), "201"); err == nil && ok {
			field("state", j.State)
		}
	})
}
