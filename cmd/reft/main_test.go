package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string
		wantErr  string
	}{
		{"no args", nil, 2, "", "usage: reft"},
		{"help", []string{"help"}, 0, "commands:", ""},
		{"version", []string{"version"}, 0, "reft ", ""},
		{"--version", []string{"--version"}, 0, "reft ", ""},
		{"unknown", []string{"frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{"explain listed", []string{"help"}, 0, "explain", ""},
		{"explain", []string{"explain", "--spec", "arc", "--dp", "2", "--nodes", "n[1-2]"}, 0, "1 failed node: 2 of 2 sets survive", ""},
		{"plan logging", []string{"plan", "logging", "--stage-seconds", "1,2,3", "--fwd-bytes", "100,100", "--bandwidth", "100",
			"--interval", "1", "--node-cap", "300", "--step-seconds", "5"}, 0, "groups [0-1] [2]; logged boundaries: 1|2", ""},
		{"explain bad flag", []string{"explain", "--spec", "arc"}, 2, "", "--nodes is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(tt.args, &out, &errb)
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d (stderr %q)", code, tt.wantCode, errb.String())
			}
			if !strings.Contains(out.String(), tt.wantOut) {
				t.Errorf("stdout %q does not contain %q", out.String(), tt.wantOut)
			}
			if !strings.Contains(errb.String(), tt.wantErr) {
				t.Errorf("stderr %q does not contain %q", errb.String(), tt.wantErr)
			}
		})
	}
}
