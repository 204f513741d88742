package plan

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/internal/logplan"
)

// ---- logging ----

// loggingFile is the --input file: the measurements as JSON. node_cap_bytes
// is a number or the string "unlimited"; backward_bytes may be left out
// when the gradients are the activations' size, as in a transformer.
type loggingFile struct {
	StageSeconds  []float64       `json:"stage_seconds"`
	ForwardBytes  []float64       `json:"forward_bytes"`
	BackwardBytes []float64       `json:"backward_bytes"`
	Bandwidth     float64         `json:"bandwidth_bytes_per_second"`
	Interval      int             `json:"snapshot_interval_steps"`
	NodeCap       json.RawMessage `json:"node_cap_bytes"`
	StepSeconds   float64         `json:"step_seconds"`
	DP            *int            `json:"dp"` // absent: 1
}

// maxInputBytes bounds --input: a pipeline of thousands of stages is a
// few hundred KiB of JSON.
const maxInputBytes = 4 << 20

// decodeLoggingInput reads an --input file. It checks the JSON's shape
// (one object, known keys, the cap's form); the numbers are checked by
// logplan.Input.Validate, which names each bad one.
func decodeLoggingInput(data []byte) (logplan.Input, int, error) {
	if len(data) > maxInputBytes {
		return logplan.Input{}, 0, fmt.Errorf("%d bytes, more than %d: this is not a measurements file", len(data), maxInputBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f loggingFile
	if err := dec.Decode(&f); err != nil {
		return logplan.Input{}, 0, fmt.Errorf("%w; the file is one JSON object with the keys in docs/PLAN.md (logging)", err)
	}
	if dec.More() {
		return logplan.Input{}, 0, errors.New("more than one JSON value: the file is one object")
	}
	capBytes, err := parseCapJSON(f.NodeCap)
	if err != nil {
		return logplan.Input{}, 0, err
	}
	if f.BackwardBytes == nil {
		f.BackwardBytes = f.ForwardBytes
	}
	dp := 1
	if f.DP != nil {
		dp = *f.DP
	}
	in := logplan.Input{StageSeconds: f.StageSeconds, ForwardBytes: f.ForwardBytes, BackwardBytes: f.BackwardBytes,
		Bandwidth: f.Bandwidth, Interval: f.Interval, NodeCap: capBytes, StepSeconds: f.StepSeconds}
	return in, dp, nil
}

func parseCapJSON(raw json.RawMessage) (float64, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, errors.New(`node_cap_bytes is required: the log bytes one node may hold, or "unlimited"`)
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "unlimited" {
			return math.Inf(1), nil
		}
		return 0, fmt.Errorf(`node_cap_bytes %q: a number of bytes, or the string "unlimited"`, s)
	}
	var v float64
	if err := json.Unmarshal(raw, &v); err != nil {
		return 0, fmt.Errorf(`node_cap_bytes %s: a number of bytes, or the string "unlimited"`, raw)
	}
	return v, nil
}

// parseNodeCap reads --node-cap: a size, 0, or "unlimited".
func parseNodeCap(s string) (float64, error) {
	switch strings.TrimSpace(s) {
	case "":
		return 0, errors.New("--node-cap is required: the log memory one node may hold, as in 8GiB, 0 (no logging) or unlimited")
	case "unlimited":
		return math.Inf(1), nil
	case "0":
		return 0, nil
	}
	n, err := config.ParseSize(s)
	if err != nil {
		return 0, fmt.Errorf("--node-cap: %w; write it as 8GiB, 512MiB, 0 or unlimited", err)
	}
	return float64(n), nil
}

// parseList reads a comma-separated list with each; the errors name flag.
func parseList(flag, s string, each func(string) (float64, error)) ([]float64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []float64
	for i, f := range strings.Split(s, ",") {
		v, err := each(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("%s item %d (%q): %w", flag, i, f, err)
		}
		out = append(out, v)
	}
	return out, nil
}

func seconds(s string) (float64, error) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, errors.New("not a number of seconds, as in 0.12")
	}
	return v, nil
}

func size(s string) (float64, error) {
	n, err := config.ParseSize(s)
	if err != nil {
		return 0, fmt.Errorf("%w; write bytes as 4096, 64MiB or 1GiB", err)
	}
	return float64(n), nil
}

// loggingFlags holds the flag forms of the measurements.
type loggingFlags struct {
	stages, fwd, bwd, bandwidth, nodeCap, input, algo string
	interval, dp                                      int
	step                                              float64
}

// measurementFlags are the flags --input replaces.
var measurementFlags = []string{"stage-seconds", "fwd-bytes", "bwd-bytes", "bandwidth", "interval", "node-cap", "step-seconds", "dp"}

func (lf *loggingFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&lf.stages, "stage-seconds", "", "each node's compute seconds per step (forward+backward), a `LIST` in pipeline order, as in 0.12,0.10,0.15")
	fs.StringVar(&lf.fwd, "fwd-bytes", "", "activation bytes per step across each boundary, `LIST` of stages-1 sizes, as in 64MiB,64MiB")
	fs.StringVar(&lf.bwd, "bwd-bytes", "", "gradient bytes per step across each boundary, `LIST` (default: --fwd-bytes; a gradient has its activation's shape)")
	fs.StringVar(&lf.bandwidth, "bandwidth", "", "node-to-node `BYTES` per second, as in 11GiB (about 100 Gb/s)")
	fs.IntVar(&lf.interval, "interval", 0, "snapshot interval in `STEPS` (the trainer's --save-every)")
	fs.StringVar(&lf.nodeCap, "node-cap", "", "log memory one node may hold: `SIZE`, 0 (no logging) or unlimited")
	fs.Float64Var(&lf.step, "step-seconds", 0, "the pipeline's measured `SECONDS` per step (reft-train's mean-step-ms / 1000)")
	fs.IntVar(&lf.dp, "dp", 1, "data-parallel degree `N`: with 2 or more every stage has replicas")
	fs.StringVar(&lf.input, "input", "", "read the measurements from a JSON `FILE` instead of the flags (docs/PLAN.md)")
	fs.StringVar(&lf.algo, "algorithm", string(logplan.Optimal), "optimal (least expected recovery) or swift-greedy (the paper's heuristic)")
}

// measurements returns the input and dp from --input or from the flags.
func (lf *loggingFlags) measurements(fs *flag.FlagSet) (logplan.Input, int, error) {
	if lf.input != "" {
		var both []string
		fs.Visit(func(f *flag.Flag) {
			for _, m := range measurementFlags {
				if f.Name == m {
					both = append(both, "--"+m)
				}
			}
		})
		if len(both) > 0 {
			return logplan.Input{}, 0, fmt.Errorf("--input and %s: give the measurements in the file or as flags, not both", strings.Join(both, ", "))
		}
		data, err := os.ReadFile(lf.input)
		if err != nil {
			return logplan.Input{}, 0, fmt.Errorf("--input: %w", err)
		}
		in, dp, err := decodeLoggingInput(data)
		if err != nil {
			return logplan.Input{}, 0, fmt.Errorf("--input %s: %w", lf.input, err)
		}
		return in, dp, nil
	}
	return lf.fromFlags()
}

func (lf *loggingFlags) fromFlags() (logplan.Input, int, error) {
	var in logplan.Input
	var err error
	if in.StageSeconds, err = parseList("--stage-seconds", lf.stages, seconds); err != nil {
		return in, 0, err
	}
	if len(in.StageSeconds) == 0 {
		return in, 0, errors.New("--stage-seconds is required: each node's compute time per step, in pipeline order (or --input FILE)")
	}
	if in.ForwardBytes, err = parseList("--fwd-bytes", lf.fwd, size); err != nil {
		return in, 0, err
	}
	if in.BackwardBytes, err = parseList("--bwd-bytes", lf.bwd, size); err != nil {
		return in, 0, err
	}
	if lf.bwd == "" {
		in.BackwardBytes = in.ForwardBytes
	}
	if lf.bandwidth == "" {
		return in, 0, errors.New("--bandwidth is required: node-to-node bytes per second, as in 11GiB")
	}
	if in.Bandwidth, err = size(strings.TrimSuffix(lf.bandwidth, "/s")); err != nil {
		return in, 0, fmt.Errorf("--bandwidth: %w", err)
	}
	if in.NodeCap, err = parseNodeCap(lf.nodeCap); err != nil {
		return in, 0, err
	}
	in.Interval, in.StepSeconds = lf.interval, lf.step
	return in, lf.dp, nil
}

// fieldNames maps logplan's fields to the flag and the --input key that
// set them, so that an error names what the user typed.
var fieldNames = map[string][2]string{
	logplan.FieldStageSeconds:  {"--stage-seconds", "stage_seconds"},
	logplan.FieldForwardBytes:  {"--fwd-bytes", "forward_bytes"},
	logplan.FieldBackwardBytes: {"--bwd-bytes", "backward_bytes"},
	logplan.FieldBandwidth:     {"--bandwidth", "bandwidth_bytes_per_second"},
	logplan.FieldInterval:      {"--interval", "snapshot_interval_steps"},
	logplan.FieldNodeCap:       {"--node-cap", "node_cap_bytes"},
	logplan.FieldStepSeconds:   {"--step-seconds", "step_seconds"},
}

// nameField prefixes a logplan input error with the flag, or with the
// --input file and its key.
func nameField(err error, file string) error {
	var fe *logplan.FieldError
	if !errors.As(err, &fe) {
		return err
	}
	names, ok := fieldNames[fe.Field]
	if !ok {
		return err
	}
	if file != "" {
		return fmt.Errorf("--input %s: %s: %w", file, names[1], err)
	}
	return fmt.Errorf("%s: %w", names[0], err)
}

type groupJSON struct {
	First            int     `json:"first"`
	Last             int     `json:"last"`
	ReplayStepSecs   float64 `json:"replay_seconds_per_step"`
	ExpectedRecovery float64 `json:"expected_recovery_seconds"`
	RatioToFull      float64 `json:"ratio_to_full_restart"`
}

type stageJSON struct {
	Stage       int      `json:"stage"`
	LogBytes    float64  `json:"node_log_bytes"`
	Protection  string   `json:"protection"`
	LoggedEdges []string `json:"logged_edges,omitempty"`
	Why         string   `json:"why"`
}

type loggingJSON struct {
	Algorithm        string      `json:"algorithm"`
	Stages           int         `json:"stages"`
	DP               int         `json:"dp"`
	IntervalSteps    int         `json:"snapshot_interval_steps"`
	KeptIntervals    int         `json:"kept_intervals"`
	NodeCapBytes     num         `json:"node_cap_bytes"` // null: unlimited
	Groups           []groupJSON `json:"groups"`
	LoggedBoundaries []string    `json:"logged_boundaries"`
	LostSteps        float64     `json:"lost_steps"`
	ExpectedRecovery float64     `json:"expected_recovery_seconds"`
	FullRestart      float64     `json:"full_restart_seconds"`
	Ratio            float64     `json:"ratio_to_full_restart"`
	StagesProtection []stageJSON `json:"protection"`
	// ReftTrainFlags is the grouping as reft-train's flags (one stage per
	// node); "" where logging protects nothing (dp > 1, or one group).
	ReftTrainFlags string `json:"reft_train_flags"`
}

func runLogging(args []string, stdout, stderr io.Writer) error {
	var out output
	fs := newFlags("logging", stderr, &out)
	var lf loggingFlags
	lf.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if out.plot != "" {
		return errors.New("--plot: the logging plan has no curves to draw; use the table or --json")
	}
	in, dp, err := lf.measurements(fs)
	if err != nil {
		return err
	}
	p, err := logplan.Choose(in, logplan.Algorithm(lf.algo))
	if err != nil {
		if fe := (*logplan.FieldError)(nil); !errors.As(err, &fe) {
			return fmt.Errorf("--algorithm: %w", err)
		}
		return nameField(err, lf.input)
	}
	prot, err := logplan.Protect(dp, len(in.StageSeconds), p)
	if err != nil {
		if lf.input != "" {
			return fmt.Errorf("--input %s: dp: %w", lf.input, err)
		}
		return fmt.Errorf("--dp: %w", err)
	}
	r := loggingReport(in, dp, lf.algo, p, prot)
	if out.json {
		return writeJSON(stdout, r)
	}
	printLogging(stdout, r)
	return nil
}

func loggingReport(in logplan.Input, dp int, algo string, p logplan.Plan, prot []logplan.StageProtection) loggingJSON {
	r := loggingJSON{Algorithm: algo, Stages: len(in.StageSeconds), DP: dp, IntervalSteps: in.Interval,
		KeptIntervals: logplan.KeptIntervals, NodeCapBytes: opt(in.NodeCap), LostSteps: p.LostSteps,
		ExpectedRecovery: p.Expected, FullRestart: p.FullRestart, Ratio: p.Expected / p.FullRestart,
		LoggedBoundaries: []string{}}
	for gi, g := range p.Groups {
		e := p.ReplaySeconds[gi] * p.LostSteps
		r.Groups = append(r.Groups, groupJSON{First: g.First, Last: g.Last, ReplayStepSecs: p.ReplaySeconds[gi],
			ExpectedRecovery: e, RatioToFull: e / p.FullRestart})
	}
	for b, l := range p.Logged {
		if l {
			r.LoggedBoundaries = append(r.LoggedBoundaries, fmt.Sprintf("%d|%d", b, b+1))
		}
	}
	if dp == 1 && len(p.Groups) > 1 {
		var gs []string
		for _, g := range p.Groups {
			if g.First == g.Last {
				gs = append(gs, fmt.Sprint(g.First))
			} else {
				gs = append(gs, fmt.Sprintf("%d-%d", g.First, g.Last))
			}
		}
		r.ReftTrainFlags = "--log-messages bubble --log-groups " + strings.Join(gs, ",")
	}
	for i, sp := range prot {
		r.StagesProtection = append(r.StagesProtection, stageJSON{Stage: i, LogBytes: p.NodeLogBytes[i],
			Protection: sp.String(), LoggedEdges: sp.Edges, Why: sp.Why})
	}
	return r
}

func printLogging(w io.Writer, r loggingJSON) {
	capText := "unlimited"
	if r.NodeCapBytes != nil {
		capText = fmtBytes(*r.NodeCapBytes)
	}
	fmt.Fprintf(w, "Selective logging (SWIFT section 5.3), algorithm %s\n", r.Algorithm)
	fmt.Fprintf(w, "%d stages, dp=%d, snapshot every %d steps (logs kept for %d intervals), node log cap %s\n",
		r.Stages, r.DP, r.IntervalSteps, r.KeptIntervals, capText)
	var gs []string
	for _, g := range r.Groups {
		gs = append(gs, groupText(g.First, g.Last))
	}
	logged := "none"
	if len(r.LoggedBoundaries) > 0 {
		logged = strings.Join(r.LoggedBoundaries, ", ")
	}
	fmt.Fprintf(w, "groups %s; logged boundaries: %s\n", strings.Join(gs, " "), logged)
	if r.ReftTrainFlags != "" {
		fmt.Fprintf(w, "reft-train (one stage per node): %s\n", r.ReftTrainFlags)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "A failure loses %.4g steps on average (half the interval). Recovery of one failed group:\n", r.LostSteps)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "group\treplay per step\texpected recovery\tfull restart\tratio\n")
	for _, g := range r.Groups {
		fmt.Fprintf(tw, "%s\t%.4g s\t%.4g s\t%.4g s\t%.2f\n", groupText(g.First, g.Last), g.ReplayStepSecs, g.ExpectedRecovery, r.FullRestart, g.RatioToFull)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nPer stage (one node each):\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "stage\tlog memory\tprotection\n")
	for _, s := range r.StagesProtection {
		fmt.Fprintf(tw, "%d\t%s\t%s\n", s.Stage, fmtBytes(s.LogBytes), s.Protection)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nExpected recovery of one node failure (every node equally likely): %.4g s, against %.4g s for a full restart from the last snapshot (ratio %.2f).\n",
		r.ExpectedRecovery, r.FullRestart, r.Ratio)
	if r.DP >= 2 {
		fmt.Fprintf(w, "With dp=%d every stage has data-parallel replicas: they recover it, and logging is not needed.\n", r.DP)
	}
}

func groupText(first, last int) string {
	if first == last {
		return fmt.Sprintf("[%d]", first)
	}
	return fmt.Sprintf("[%d-%d]", first, last)
}

func fmtBytes(b float64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.3g GiB", b/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.3g MiB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.3g KiB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}
