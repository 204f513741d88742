package recoverylog

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzRead: a recovery log (in the shared log directory: another user may
// have written it) reads as events and bad lines, one per non-blank line,
// every event named; and `reft log`'s text of them never panics.
func FuzzRead(f *testing.F) {
	var b bytes.Buffer
	w := NewWriter(&b)
	for _, e := range []Event{
		{Time: time.Unix(1e9, 0), Level: "warn", Job: "42", Step: "42.0", Node: "n3", Event: FailureDetected, Kind: KindRank,
			Nodes: []string{"n3"}, Ranks: []int{2}, DetectedBy: "agents"},
		{Job: "42", Event: Resumed, Generation: -1, LostSteps: new(int64)},
		{Job: "42", Event: StepRelaunched, Relaunch: 1, Nodes: []string{"n1", "n2"}},
		{Job: "42", Event: RestorePeer, Ranks: []int{0, 1}, Bytes: 1 << 40, DurationS: -1},
	} {
		if err := w.Write(e); err != nil {
			f.Fatal(err)
		}
	}
	f.Add(b.Bytes())
	f.Add([]byte("{\"event\":\"failure_detected\",\"ranks\":[-1,9223372036854775807],\"detection_s\":1e308}\nnot json\n{}\n{\"event\":\"x\"\n"))
	f.Add([]byte("{\"event\":\"resumed\",\"lost_steps\":-9223372036854775808,\"duration_s\":-1e308,\"bytes\":-1}\r\n\n  \n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		events, bad, err := Read(bytes.NewReader(in))
		if err != nil {
			return // a line over the scanner's limit
		}
		lines := 0
		for _, l := range bytes.Split(in, []byte("\n")) {
			if len(bytes.TrimSpace(l)) > 0 {
				lines++
			}
		}
		if len(events)+len(bad) != lines {
			t.Fatalf("%d events and %d bad lines from %d lines", len(events), len(bad), lines)
		}
		for _, e := range events {
			if e.Event == "" {
				t.Fatalf("event without a name: %+v", e)
			}
			_ = Describe(e)
			_ = Format(e)
		}
		_ = Summarize(events)
		_ = Timeline(nil, events)
	})
}

// formatSacct writes records back as `sacct -P -n` lines.
func formatSacct(recs []Record) string {
	var b strings.Builder
	tm := func(t time.Time) string {
		if t.IsZero() {
			return "Unknown"
		}
		// time.Parse takes fractional seconds the layout does not name
		// (sacct never prints them): keep them so the records compare.
		return t.Format(sacctTime + ".999999999")
	}
	for _, r := range recs {
		b.WriteString(strings.Join([]string{r.JobID, r.Name, r.State, r.ExitCode, tm(r.Start), tm(r.End), r.Elapsed,
			strconv.Itoa(r.NNodes), r.NodeList, r.Comment}, "|") + "\n")
	}
	return b.String()
}

// FuzzParseSacct: sacct's output (job names and comments are the user's)
// parses to records that print back as the same records, or to an error
// that names the line; the timeline of them never panics.
func FuzzParseSacct(f *testing.F) {
	f.Add(sacctOut)
	f.Add("1|a|RUNNING|0:0|Unknown|None|00:00:00||(null)|\r\n\n")
	f.Add("1|a|b|c|2026-13-01T00:00:00|x|y|z|n|c")
	f.Add("1|a|b|c|||||n|c|d|e\n2.3|||||||-0||")
	f.Add("1.0|a|b|c|2026-01-01T00:00:00|2025-01-01T00:00:00|e|+7|n|")
	f.Fuzz(func(t *testing.T, out string) {
		recs, err := ParseSacct(out, time.UTC)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "sacct line ") {
				t.Fatalf("error %q does not name the line", err)
			}
			return
		}
		again, err := ParseSacct(formatSacct(recs), time.UTC)
		if err != nil || len(again) != len(recs) {
			t.Fatalf("records do not print back: %v, %d of %d", err, len(again), len(recs))
		}
		for i := range recs {
			a, b := recs[i], again[i]
			if !a.Start.Equal(b.Start) || !a.End.Equal(b.End) {
				t.Fatalf("record %d's times: %v %v, then %v %v", i, a.Start, a.End, b.Start, b.End)
			}
			a.Start, a.End, b.Start, b.End = time.Time{}, time.Time{}, time.Time{}, time.Time{}
			if a != b {
				t.Fatalf("record %d: %+v, then %+v", i, a, b)
			}
		}
		_ = Timeline(recs, nil)
	})
}

// FuzzParseScontrolJob: `scontrol -o show job` output (the comment and
// the job name are the user's) parses without panicking; what it accepts
// is one line, and errors are one line.
func FuzzParseScontrolJob(f *testing.F) {
	f.Add("JobId=174 JobName=rjob.sh UserId=reft-alice(1001) JobState=RUNNING Reason=None Requeue=1 Restarts=2 " +
		"NodeList=n[1-4] BatchHost=n1 Comment=reft: 1 failure (rank 2 on n3), relaunched  StdErr=/x/r.out StdIn=/dev/null")
	f.Add("JobId=1 JobState=PENDING Restarts=0 NodeList=(null) Comment=(null)")
	f.Add("JobState=RUNNING Restarts=many")
	f.Add("Comment=JobState=X Restarts=1 JobState=Y\nComment=a\n b")
	f.Add("JobState= Restarts=99999999999999999999")
	f.Fuzz(func(t *testing.T, out string) {
		j, err := ParseScontrolJob(out)
		if err != nil {
			if strings.ContainsAny(err.Error(), "\n\r") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		for _, s := range []string{j.State, j.NodeList, j.Comment} {
			if strings.Contains(s, "\n") {
				t.Fatalf("field %q spans lines", s)
			}
		}
	})
}
