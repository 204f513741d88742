package recoverylog

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/reft-hpc/reft/agent/config"
)

// Report is what `reft log` prints: the job as Slurm knows it and the
// joined timeline. --json prints it as one JSON object.
type Report struct {
	Job      string   `json:"job"`
	State    string   `json:"state"`              // from scontrol while it knows the job, else sacct
	Restarts *int     `json:"restarts,omitempty"` // requeues, from scontrol; absent once slurmctld forgot the job
	Comment  string   `json:"comment"`
	LogFile  string   `json:"recovery_log"`
	Timeline []Entry  `json:"timeline"`
	Warnings []string `json:"warnings,omitempty"`
}

var jobIDRe = regexp.MustCompile(`^[0-9]+$`)

// Command is `reft log JOBID`.
func Command(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("reft log", flag.ContinueOnError)
	fs.SetOutput(stderr)
	confPath := fs.String("config", config.UserPath(), "reft configuration `file`, default $REFT_CONFIG or "+config.DefaultPath+" (for [log] dir)")
	logDir := fs.String("log-dir", "", "log `dir` holding <jobid>/recovery.jsonl; default: log.dir from the configuration")
	asJSON := fs.Bool("json", false, "print the report as one JSON object")
	plotFile := fs.String("plot", "", "also draw the timeline into `FILE` (.png or .svg): one lane per node, steps, failure, detection, exclusion, restores, resume")
	sacct := fs.String("sacct", "sacct", "sacct `program`")
	scontrol := fs.String("scontrol", "scontrol", "scontrol `program`")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: reft log [--json] [--plot FILE.png|FILE.svg] [--config FILE] JOBID\n\n"+
			"Prints a job's recovery timeline: its Slurm steps (sacct) joined with the events\n"+
			"that reft run wrote to <log dir>/<jobid>/%s.\n\n", FileName)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 1 || !jobIDRe.MatchString(fs.Arg(0)) {
		fmt.Fprintln(stderr, "reft log: want one numeric job id, e.g. reft log 4242")
		return 2
	}
	job := fs.Arg(0)
	if ext := strings.ToLower(filepath.Ext(*plotFile)); *plotFile != "" && ext != ".png" && ext != ".svg" {
		fmt.Fprintf(stderr, "reft log: --plot %q: the file must end in .png or .svg\n", *plotFile)
		return 2
	}
	if *logDir == "" {
		c, err := config.Load(*confPath, config.MissingOK(*confPath))
		if err != nil {
			fmt.Fprintln(stderr, "reft log:", err)
			return 1
		}
		*logDir = c.Log.Dir
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := Build(ctx, job, *logDir, *sacct, *scontrol)
	if err != nil {
		fmt.Fprintln(stderr, "reft log:", err)
		return 1
	}
	if *plotFile != "" {
		if err := SavePlot(rep, *plotFile); err != nil {
			fmt.Fprintln(stderr, "reft log:", err)
			return 1
		}
		fmt.Fprintf(stderr, "reft log: drew the timeline into %s\n", *plotFile)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintln(stderr, "reft log:", err)
			return 1
		}
		return 0
	}
	WriteText(stdout, rep)
	for _, w := range rep.Warnings {
		fmt.Fprintln(stderr, "reft log: warning:", w)
	}
	return 0
}

// Build gathers a job's report. A job that neither sacct nor the recovery
// log knows is an error.
func Build(ctx context.Context, job, logDir, sacct, scontrol string) (Report, error) {
	rep := Report{Job: job, LogFile: Path(logDir, job)}
	recs, err := Sacct(ctx, sacct, job)
	if err != nil {
		return rep, err
	}
	events, bad, err := ReadFile(rep.LogFile)
	if err != nil {
		return rep, err
	}
	for _, b := range bad {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s: skipped %v", rep.LogFile, b))
	}
	if len(recs) == 0 && len(events) == 0 {
		return rep, fmt.Errorf("job %s: sacct has no record of it and there is no %s (wrong job id, or log.dir differs from the job's?)", job, rep.LogFile)
	}
	if len(events) == 0 {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("no recovery events in %s: the job did not use reft run, or log.dir differs", rep.LogFile))
	}
	for _, r := range recs {
		if r.IsJob() { // with -D, the last is the newest run of the job
			rep.State, rep.Comment = r.State, r.Comment
		}
	}
	info, found, err := ScontrolJob(ctx, scontrol, job)
	if err != nil {
		rep.Warnings = append(rep.Warnings, err.Error())
	}
	if found {
		rep.State, rep.Comment = info.State, info.Comment
		n := info.Restarts
		rep.Restarts = &n
	}
	rep.Timeline = Timeline(recs, events)
	return rep, nil
}

// WriteText prints the report for humans.
func WriteText(w io.Writer, rep Report) {
	restarts := "unknown (slurmctld no longer knows the job)"
	if rep.Restarts != nil {
		restarts = fmt.Sprint(*rep.Restarts)
	}
	fmt.Fprintf(w, "job %s: %s, requeued %s time(s)\n", rep.Job, orNone(rep.State), restarts)
	fmt.Fprintf(w, "comment: %s\n", orNone(rep.Comment))
	fmt.Fprintf(w, "recovery log: %s\n\n", rep.LogFile)
	for _, e := range rep.Timeline {
		fmt.Fprintf(w, "%s  %-5s  %-18s  %s\n", e.Time.Local().Format("2006-01-02 15:04:05.000"), e.Source, e.Event, e.Text)
	}
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
