package recoverylog

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// SacctFields are the sacct columns `reft log` asks for, in this order.
// Comment comes last: it is free text and may hold the -P delimiter.
// (Slurm 22.05's sacct has no Restarts column; scontrol has it while the
// job is known.)
var SacctFields = []string{"JobID", "JobName", "State", "ExitCode", "Start", "End", "Elapsed", "NNodes", "NodeList", "Comment"}

// Record is one line of sacct: the job allocation ("42"), or one of its
// steps ("42.batch", "42.extern", "42.0").
type Record struct {
	JobID    string    `json:"job_id"`
	Name     string    `json:"name"`
	State    string    `json:"state"`
	ExitCode string    `json:"exit_code"` // "code:signal"
	Start    time.Time `json:"start,omitzero"`
	End      time.Time `json:"end,omitzero"`
	Elapsed  string    `json:"elapsed"`
	NNodes   int       `json:"nnodes"`
	NodeList string    `json:"nodelist"`
	Comment  string    `json:"comment,omitempty"`
}

// IsJob says whether the record is the job allocation rather than a step.
func (r Record) IsJob() bool { return !strings.Contains(r.JobID, ".") }

// StepID is the part after the job id: "batch", "extern", "0"; "" for the job.
func (r Record) StepID() string {
	_, s, _ := strings.Cut(r.JobID, ".")
	return s
}

// sacctTime is sacct's time format (local time, no zone).
const sacctTime = "2006-01-02T15:04:05"

// ParseSacct parses `sacct -P -n -o <SacctFields>` output. Times are read
// in loc (sacct prints local time); "Unknown" and "None" are the zero time.
func ParseSacct(out string, loc *time.Location) ([]Record, error) {
	var recs []Record
	for n, line := range strings.Split(out, "\n") {
		line = strings.TrimRight(line, "\r")
		if strings.TrimSpace(line) == "" {
			continue
		}
		f := strings.Split(line, "|")
		if len(f) < len(SacctFields) {
			return nil, fmt.Errorf("sacct line %d has %d fields, want %d (%s): %q", n+1, len(f), len(SacctFields), strings.Join(SacctFields, ","), line)
		}
		r := Record{JobID: f[0], Name: f[1], State: f[2], ExitCode: f[3], Elapsed: f[6], NodeList: f[8],
			Comment: strings.Join(f[9:], "|")}
		var err error
		if r.Start, err = parseSacctTime(f[4], loc); err != nil {
			return nil, fmt.Errorf("sacct line %d: Start: %w", n+1, err)
		}
		if r.End, err = parseSacctTime(f[5], loc); err != nil {
			return nil, fmt.Errorf("sacct line %d: End: %w", n+1, err)
		}
		if f[7] != "" {
			if r.NNodes, err = strconv.Atoi(f[7]); err != nil {
				return nil, fmt.Errorf("sacct line %d: NNodes %q is not a number", n+1, f[7])
			}
		}
		recs = append(recs, r)
	}
	return recs, nil
}

func parseSacctTime(s string, loc *time.Location) (time.Time, error) {
	switch s {
	case "", "Unknown", "None":
		return time.Time{}, nil
	}
	t, err := time.ParseInLocation(sacctTime, s, loc)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is not a sacct time (%s)", s, sacctTime)
	}
	return t, nil
}

// Sacct runs sacct for one job, every instance of it (-D: a requeued job
// has one per run).
func Sacct(ctx context.Context, prog, job string) ([]Record, error) {
	cmd := exec.CommandContext(ctx, prog, "-j", job, "-D", "-P", "-n", "-o", strings.Join(SacctFields, ","))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s -j %s: %w: %s (sacct needs slurmdbd: AccountingStorageType=accounting_storage/slurmdbd)",
			prog, job, err, oneLine(stderr.String()))
	}
	return ParseSacct(stdout.String(), time.Local)
}

// JobInfo is what scontrol says about a job it still knows.
type JobInfo struct {
	State    string `json:"state"`
	Restarts int    `json:"restarts"`
	NodeList string `json:"nodelist"`
	Comment  string `json:"comment"`
}

var (
	scontrolKV      = regexp.MustCompile(`(?:^|\s)(JobState|Restarts|NodeList)=(\S*)`)
	scontrolComment = regexp.MustCompile(`(?:^|\s)Comment=(.*?)(?:\s+[A-Z][A-Za-z]*=|$)`)
)

// ParseScontrolJob reads `scontrol -o show job` output (one line).
func ParseScontrolJob(out string) (JobInfo, error) {
	var j JobInfo
	seen := 0
	for _, m := range scontrolKV.FindAllStringSubmatch(out, -1) {
		switch m[1] {
		case "JobState":
			j.State = m[2]
			seen++
		case "Restarts":
			n, err := strconv.Atoi(m[2])
			if err != nil {
				return JobInfo{}, fmt.Errorf("scontrol show job: Restarts=%q is not a number", m[2])
			}
			j.Restarts = n
			seen++
		case "NodeList":
			if m[2] != "(null)" {
				j.NodeList = m[2]
			}
		}
	}
	if seen < 2 {
		return JobInfo{}, fmt.Errorf("scontrol show job: no JobState and Restarts in %q", oneLine(out))
	}
	if m := scontrolComment.FindStringSubmatch(out); m != nil && m[1] != "(null)" {
		j.Comment = m[1]
	}
	return j, nil
}

// ScontrolJob asks slurmctld about a job; found is false once it has
// forgotten the job (MinJobAge after its end).
func ScontrolJob(ctx context.Context, prog, job string) (info JobInfo, found bool, err error) {
	cmd := exec.CommandContext(ctx, prog, "-o", "show", "job", job)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if strings.Contains(stderr.String(), "Invalid job id") {
			return JobInfo{}, false, nil
		}
		return JobInfo{}, false, fmt.Errorf("%s show job %s: %w: %s", prog, job, err, oneLine(stderr.String()))
	}
	info, err = ParseScontrolJob(stdout.String())
	return info, err == nil, err
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}
