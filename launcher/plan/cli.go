package plan

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

type subcommand struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) error
}

var subcommands = map[string]subcommand{
	"survival":  {"probability that in-memory state survives, with reft and with checkpoints alone (REFT Eq. 5, 6)", runSurvival},
	"placement": {"recovery probability of group/mixed vs ring replica placement (GEMINI Corollary 1)", runPlacement},
	"interval":  {"optimal persistent-checkpoint frequency and wasted time (JIT Eq. 3, 5, 6)", runInterval},
	"memory":    {"host memory per node for snapshots against REFT's 3x bound", runMemory},
	"logging":   {"which pipeline boundaries to log under a per-node cap, and the recovery time (SWIFT 5.3)", runLogging},
	"simulate":  {"Monte Carlo check of the survival model, up to 16384 nodes", runSimulate},
}

// applyMode parses --mode, sets the model's tolerance from it, and checks
// the mode against the group size, then the model, then --threshold: the
// order in which the survival and simulate commands report mistakes.
func applyMode(spec string, sgSize int, tolerance *int, validate func() error, threshold float64) (Mode, error) {
	mode, err := ParseMode(spec)
	if err != nil {
		return Mode{}, err
	}
	*tolerance = mode.Tolerance()
	if err := checkModeFits(mode, sgSize); err != nil {
		return Mode{}, err
	}
	if err := validate(); err != nil {
		return Mode{}, err
	}
	return mode, checkThreshold(threshold)
}

// errHelp means -h was given: the flag package has printed the usage.
var errHelp = flag.ErrHelp

func usage() string {
	names := make([]string, 0, len(subcommands))
	for n := range subcommands {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("usage: reft plan SUBCOMMAND [FLAGS]\n\nsubcommands:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  %-10s %s\n", n, subcommands[n].summary)
	}
	b.WriteString("\nEach prints a table; --json prints the numbers, --plot FILE.png|FILE.svg draws them.\n" +
		"Run 'reft plan SUBCOMMAND -h' for its flags. docs/PLAN.md explains the models.\n")
	return b.String()
}

// Main is the `reft plan` entry point; it returns the process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return 2
	}
	switch args[0] {
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage())
		return 0
	}
	sc, ok := subcommands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "reft plan: unknown subcommand %q; run 'reft plan help' for the list\n", args[0])
		return 2
	}
	err := sc.run(args[1:], stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errHelp):
		return 0
	}
	fmt.Fprintf(stderr, "reft plan %s: %v\n", args[0], err)
	return 2
}

// output holds the flags every subcommand shares.
type output struct {
	json bool
	plot string
}

func newFlags(name string, stderr io.Writer, out *output) *flag.FlagSet {
	fs := flag.NewFlagSet("reft plan "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&out.json, "json", false, "print the results as JSON instead of a table")
	fs.StringVar(&out.plot, "plot", "", "also draw the curves into `FILE`.png or FILE.svg")
	return fs
}

// parse runs fs.Parse and rejects stray arguments, which are usually a
// forgotten "--" before a flag's value.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errHelp
		}
		return fmt.Errorf("%w; run '%s -h' for the flags", err, fs.Name())
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q; every input is a --flag", fs.Arg(0))
	}
	return nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// num is an optional JSON number: null where the value is undefined or
// infinite, since JSON has no NaN or Inf.
type num = *float64

func opt(v float64) num {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

func fmtDays(d float64) string {
	if math.IsInf(d, 1) {
		return "forever (no failure of that kind is possible)"
	}
	return fmt.Sprintf("%.3g days", d)
}

func checkThreshold(p float64) error {
	if !(p > 0 && p < 1) {
		return fmt.Errorf("--threshold must lie strictly between 0 and 1, as in 0.9; got %g", p)
	}
	return nil
}

// checkModeFits explains a mode too strong for the SG in the mode's terms;
// an SG below 2 is left to validate, whose message names that fix instead.
func checkModeFits(m Mode, sgSize int) error {
	if sgSize < 2 {
		return nil
	}
	return m.checkTolerance(sgSize)
}

func parseShapes(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(v > 0) {
			return nil, fmt.Errorf("--shapes %q must be a comma-separated list of positive numbers, as in 1.0,1.3,1.5,2.0", s)
		}
		out = append(out, v)
	}
	return out, nil
}

// ---- survival ----

type survivalPoint struct {
	Days       float64 `json:"days"`
	Reft       float64 `json:"reft"`
	Checkpoint float64 `json:"checkpoint"`
}

type survivalJSON struct {
	ReftDays       num             `json:"reft_days"`
	CheckpointDays num             `json:"checkpoint_days"`
	Threshold      float64         `json:"threshold"`
	Mode           string          `json:"mode"`
	Tolerance      int             `json:"tolerance"`
	Devices        int             `json:"devices"`
	SGSize         int             `json:"sg_size"`
	Groups         int             `json:"groups"`
	Shape          float64         `json:"shape"`
	HWRate         float64         `json:"hw_rate"`
	SWRate         float64         `json:"sw_rate"`
	AgentRate      float64         `json:"agent_rate"`
	Curve          []survivalPoint `json:"curve"`
}

func runSurvival(args []string, stdout, stderr io.Writer) error {
	var out output
	fs := newFlags("survival", stderr, &out)
	var s Survival
	fs.IntVar(&s.Units, "devices", 3072, "failure units `K` (devices or nodes: whatever the rates count)")
	fs.IntVar(&s.SGSize, "sg-size", 6, "members `N` per sharding group (the DP degree)")
	fs.Float64Var(&s.Shape, "shape", 1.3, "Weibull shape `C` (1: constant rate; >1: wear-out)")
	fs.Float64Var(&s.HWRate, "hw-rate", 1e-4, "hardware failures per unit per day^C (lose host memory)")
	fs.Float64Var(&s.SWRate, "sw-rate", 1e-5, "software failures per unit per day^C (reft survives them)")
	fs.Float64Var(&s.AgentRate, "agent-rate", 0, "failures of reft's own snapshot process per unit per day^C (P_re)")
	threshold := fs.Float64("threshold", 0.9, "survival probability `P` the state must keep")
	modeSpec := fs.String("mode", "arc", "protection `SPEC`: arc, arc:R, aec, aec:K, aor, or '+' combinations")
	shapesSpec := fs.String("shapes", "1.0,1.3,1.5,2.0", "Weibull shapes drawn by --plot, as in REFT Fig. 8")
	if err := parse(fs, args); err != nil {
		return err
	}
	mode, err := applyMode(*modeSpec, s.SGSize, &s.Tolerance, func() error { return s.validate() }, *threshold)
	if err != nil {
		return err
	}
	shapes, err := parseShapes(*shapesSpec)
	if err != nil {
		return err
	}
	rd, cd := s.ReftDays(*threshold), s.CheckpointDays(*threshold)
	grid := []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 90, 180, 365}
	if out.plot != "" {
		if !containsFloat(shapes, s.Shape) {
			shapes = append(shapes, s.Shape)
			sort.Float64s(shapes)
		}
		p, err := survivalPlot(s, shapes, *threshold, mode.Spec)
		if err != nil {
			return err
		}
		if err := savePlot(p, out.plot); err != nil {
			return err
		}
	}
	if out.json {
		j := survivalJSON{
			ReftDays: opt(rd), CheckpointDays: opt(cd), Threshold: *threshold,
			Mode: mode.Spec, Tolerance: s.Tolerance, Devices: s.Units, SGSize: s.SGSize,
			Groups: s.Units / s.SGSize, Shape: s.Shape, HWRate: s.HWRate, SWRate: s.SWRate, AgentRate: s.AgentRate,
		}
		for _, t := range grid {
			j.Curve = append(j.Curve, survivalPoint{t, s.Reft(t), s.Checkpoint(t)})
		}
		return writeJSON(stdout, j)
	}
	fmt.Fprintf(stdout, "Survival of in-memory state (REFT Eq. 5 and 6)\n")
	fmt.Fprintf(stdout, "%d units in %d sharding groups of %d; mode %s survives %d loss(es) per group\n",
		s.Units, s.Units/s.SGSize, s.SGSize, mode.Spec, s.Tolerance)
	fmt.Fprintf(stdout, "Weibull shape %g; per unit per day^%g: hardware %g, software %g, reft agent %g\n\n",
		s.Shape, s.Shape, s.HWRate, s.SWRate, s.AgentRate)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "days\twith reft\tcheckpoint only\t")
	for _, t := range grid {
		fmt.Fprintf(tw, "%g\t%.4f\t%.4f\t\n", t, s.Reft(t), s.Checkpoint(t))
	}
	tw.Flush()
	fmt.Fprintf(stdout, "\nTime above %g: with reft %s, checkpoint only %s.\n", *threshold, fmtDays(rd), fmtDays(cd))
	if !math.IsInf(rd, 1) {
		fmt.Fprintf(stdout, "Persist at least every %s with reft to keep that probability.\n", fmtDays(rd))
	}
	return nil
}

func containsFloat(xs []float64, v float64) bool {
	for _, x := range xs {
		if x == v {
			return true
		}
	}
	return false
}

// ---- placement ----

type placementJSON struct {
	RecoveryProbability float64 `json:"recovery_probability"`
	RingProbability     float64 `json:"ring_probability"`
	CorollaryBound      num     `json:"corollary_bound"`
	Strategy            string  `json:"strategy"`
	Groups              int     `json:"groups"`
	RingSize            int     `json:"ring_size"`
	Nodes               int     `json:"nodes"`
	Replicas            int     `json:"replicas"`
	Failures            int     `json:"failures"`
}

func runPlacement(args []string, stdout, stderr io.Writer) error {
	var out output
	fs := newFlags("placement", stderr, &out)
	var pl Placement
	fs.IntVar(&pl.Nodes, "nodes", 16, "machines `N` in the job")
	fs.IntVar(&pl.Replicas, "replicas", 2, "copies `M` of each checkpoint in CPU memory, the local one included")
	fs.IntVar(&pl.Failures, "failures", 2, "machines `K` lost at the same time")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := pl.validate(); err != nil {
		return err
	}
	groups, ring := pl.Layout()
	strategy := "group"
	if ring > 0 {
		strategy = "mixed"
	}
	if out.plot != "" {
		p, err := placementPlot(pl)
		if err != nil {
			return err
		}
		if err := savePlot(p, out.plot); err != nil {
			return err
		}
	}
	if out.json {
		return writeJSON(stdout, placementJSON{
			RecoveryProbability: pl.Recovery(), RingProbability: pl.Ring(), CorollaryBound: opt(pl.CorollaryBound()),
			Strategy: strategy, Groups: groups, RingSize: ring, Nodes: pl.Nodes, Replicas: pl.Replicas, Failures: pl.Failures,
		})
	}
	fmt.Fprintf(stdout, "Recovery from CPU memory when machines fail at once (GEMINI Corollary 1)\n")
	if ring > 0 {
		fmt.Fprintf(stdout, "%d machines, %d replicas: mixed placement, %d groups of %d and a ring of %d\n\n", pl.Nodes, pl.Replicas, groups, pl.Replicas, ring)
	} else {
		fmt.Fprintf(stdout, "%d machines, %d replicas: group placement, %d groups of %d\n\n", pl.Nodes, pl.Replicas, groups, pl.Replicas)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "failed\t%s\tring\tCorollary 1 bound\t\n", strategy)
	lo := max(1, pl.Failures-8)
	hi := min(pl.Nodes, max(pl.Failures+2, pl.Replicas+1))
	for k := lo; k <= hi; k++ {
		q := pl
		q.Failures = k
		b := "n/a"
		if v := q.CorollaryBound(); !math.IsNaN(v) {
			b = pct(v)
		}
		mark := ""
		if k == pl.Failures {
			mark = " <"
		}
		fmt.Fprintf(tw, "%d%s\t%s\t%s\t%s\t\n", k, mark, pct(q.Recovery()), pct(q.Ring()), b)
	}
	tw.Flush()
	fmt.Fprintf(stdout, "\nWith %d machines lost: %s recovers from memory %s of the time, ring placement %s.\n",
		pl.Failures, strategy, pct(pl.Recovery()), pct(pl.Ring()))
	return nil
}

func pct(v float64) string { return fmt.Sprintf("%.1f %%", 100*v) }

// ---- interval ----

type intervalJSON struct {
	PerHour             float64  `json:"per_hour"`
	IntervalMinutes     float64  `json:"interval_minutes"`
	WastedFraction      float64  `json:"wasted_fraction"`
	WastedPerUseful     float64  `json:"wasted_per_useful"`
	JobFailuresPerDay   float64  `json:"job_failures_per_day"`
	PeriodicLossSeconds float64  `json:"periodic_loss_seconds"`
	ReftLossSeconds     num      `json:"reft_loss_seconds,omitempty"`
	ReftWastedFraction  num      `json:"reft_wasted_fraction,omitempty"`
	Warnings            []string `json:"warnings,omitempty"`
}

func runInterval(args []string, stdout, stderr io.Writer) error {
	var out output
	fs := newFlags("interval", stderr, &out)
	var iv Interval
	fs.IntVar(&iv.GPUs, "gpus", 0, "GPUs `N` in the job (required)")
	fs.Float64Var(&iv.FailuresPerGPUDay, "failures-per-gpu-day", 2e-3, "failures `F` of one GPU per day (2e-3 is OPT-175B's 2 a day on 992 GPUs)")
	fs.Float64Var(&iv.CheckpointSeconds, "checkpoint-seconds", 0, "seconds `O` one persistent checkpoint stalls training (required)")
	fs.Float64Var(&iv.RestartSeconds, "restart-seconds", -1, "seconds `R` from failure to training again, work redone excluded (required)")
	fs.Float64Var(&iv.StepSeconds, "step-seconds", 0, "seconds `M` of one training step; adds reft's figures")
	fs.Float64Var(&iv.ReftRestartSeconds, "reft-restart-seconds", 0, "seconds a restart from peer memory takes (default: --restart-seconds)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if iv.RestartSeconds == -1 {
		return fmt.Errorf("--restart-seconds is required: the seconds from a failure to training again (JIT Table 8 uses 9.9)")
	}
	if err := iv.validate(); err != nil {
		return err
	}
	if out.plot != "" {
		p, err := intervalPlot(iv)
		if err != nil {
			return err
		}
		if err := savePlot(p, out.plot); err != nil {
			return err
		}
	}
	j := intervalJSON{
		PerHour: iv.PerHour(), IntervalMinutes: 60 / iv.PerHour(),
		WastedFraction: iv.WastedFraction(), WastedPerUseful: iv.WastedPerUseful(),
		JobFailuresPerDay: float64(iv.GPUs) * iv.FailuresPerGPUDay, PeriodicLossSeconds: iv.PeriodicLossSeconds(),
		Warnings: iv.warnings(),
	}
	if iv.StepSeconds > 0 {
		j.ReftLossSeconds, j.ReftWastedFraction = opt(iv.ReftLossSeconds()), opt(iv.ReftWastedFraction())
	}
	if out.json {
		return writeJSON(stdout, j)
	}
	fmt.Fprintf(stdout, "Persistent checkpoint interval (JIT section 5)\n")
	fmt.Fprintf(stdout, "%d GPUs, %g failures per GPU-day (%.3g job failures a day), checkpoint %g s, restart %g s\n\n",
		iv.GPUs, iv.FailuresPerGPUDay, j.JobFailuresPerDay, iv.CheckpointSeconds, iv.RestartSeconds)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "optimal frequency c* (Eq. 3)\t%.3g per hour, every %.3g minutes\n", j.PerHour, j.IntervalMinutes)
	fmt.Fprintf(tw, "wasted per useful time w* (Eq. 5)\t%.3g %%\n", 100*j.WastedPerUseful)
	fmt.Fprintf(tw, "wasted share of wall time w_f (Eq. 6)\t%.3g %%\n", 100*j.WastedFraction)
	fmt.Fprintf(tw, "average loss per failure (GEMINI Eq. 1)\t%.4g s\n", j.PeriodicLossSeconds)
	if iv.StepSeconds > 0 {
		fmt.Fprintf(tw, "reft loss per failure (one step + restart)\t%.4g s\n", iv.ReftLossSeconds())
		fmt.Fprintf(tw, "reft wasted share of wall time\t%.3g %%\n", 100*iv.ReftWastedFraction())
	}
	tw.Flush()
	for _, w := range j.Warnings {
		fmt.Fprintf(stdout, "warning: %s\n", w)
	}
	return nil
}

// ---- memory ----

func runMemory(args []string, stdout, stderr io.Writer) error {
	var out output
	fs := newFlags("memory", stderr, &out)
	var mm Memory
	params := fs.String("params", "", "model parameters `P`, as in 7e9, 7B or 1.3T (required)")
	fs.StringVar(&mm.Optimizer, "optimizer", "adam", "adam (12 bytes/param of fp32 master and moments) or sgd (8: master and momentum)")
	fs.IntVar(&mm.DP, "dp", 0, "data-parallel degree `D`: the sharding group size (required)")
	fs.IntVar(&mm.PP, "pp", 1, "pipeline-parallel degree")
	fs.IntVar(&mm.TP, "tp", 1, "tensor-parallel degree")
	fs.IntVar(&mm.GPUsPerNode, "gpus-per-node", 8, "GPUs `G` (ranks) per node")
	modeSpec := fs.String("mode", "arc", "protection `SPEC`: arc, arc:R, aec, aec:K, aor, off, or '+' combinations")
	fs.Float64Var(&mm.ParamBytes, "param-bytes", 2, "bytes per weight on the GPU (2 for bf16/fp16)")
	fs.IntVar(&mm.Generations, "generations", 2, "snapshot generations kept (reft: one completed, one ongoing)")
	fs.Float64Var(&mm.NodeRAMGiB, "node-ram-gib", 1024, "host RAM of one node in GiB")
	fs.BoolVar(&mm.ZeRO1, "zero1", false, "the optimizer state is sharded across DP on the GPUs (ZeRO-1)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *params == "" {
		return fmt.Errorf("--params is required: the model's parameter count, as in --params 7B")
	}
	if mm.DP == 0 {
		return fmt.Errorf("--dp is required: the data-parallel degree, which is the sharding group size")
	}
	var err error
	if mm.Params, err = parseCount(*params); err != nil {
		return err
	}
	if mm.Mode, err = ParseMode(*modeSpec); err != nil {
		return err
	}
	mm.Optimizer = strings.ToLower(mm.Optimizer)
	if err := mm.validate(); err != nil {
		return err
	}
	r := mm.Plan()
	if out.plot != "" {
		p, err := memoryPlot(mm)
		if err != nil {
			return err
		}
		if err := savePlot(p, out.plot); err != nil {
			return err
		}
	}
	if out.json {
		return writeJSON(stdout, r)
	}
	gib := func(b float64) string { return fmt.Sprintf("%.3g GiB", b/(1<<30)) }
	fmt.Fprintf(stdout, "Host memory for snapshots, per node\n")
	fmt.Fprintf(stdout, "%.4g params, %s, dp=%d pp=%d tp=%d: %d nodes of %d GPUs; sharding groups of %d; mode %s\n\n",
		mm.Params, mm.Optimizer, mm.DP, mm.PP, mm.TP, r.Nodes, mm.GPUsPerNode, r.SGSize, mm.Mode.Spec)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "own shard per rank, per generation\t%s\n", gib(r.OwnPerRank))
	fmt.Fprintf(tw, "redundancy per rank, per generation\t%s\n", gib(r.RedunPerRank))
	fmt.Fprintf(tw, "per rank, %d generations\t%s\n", mm.Generations, gib(r.PerRank))
	fmt.Fprintf(tw, "per node (%d ranks)\t%s\n", mm.GPUsPerNode, gib(r.Node))
	fmt.Fprintf(tw, "model+optimizer state on the node's GPUs\t%s\n", gib(r.State))
	fmt.Fprintf(tw, "REFT bound, 3x that\t%s\n", gib(r.Bound))
	fmt.Fprintf(tw, "snapshots / state\t%.2fx\n", r.Ratio)
	fmt.Fprintf(tw, "share of %g GiB node RAM\t%.1f %%\n", mm.NodeRAMGiB, 100*r.RAMShare)
	tw.Flush()
	if r.WithinBound {
		fmt.Fprintf(stdout, "\nWithin REFT's \"at most 3x\" bound.\n")
	} else {
		fmt.Fprintf(stdout, "\nAbove REFT's \"at most 3x\" bound: %.2fx. Keep fewer generations or pick a lighter mode (aec instead of arc).\n", r.Ratio)
	}
	if r.RAMShare > 0.5 {
		fmt.Fprintf(stdout, "warning: snapshots take %.0f %% of host RAM; the data loader and page cache need the rest.\n", 100*r.RAMShare)
	}
	return nil
}

// ---- simulate ----

// estimateJSON: a null day means "beyond every trial" (no loss was drawn).
type estimateJSON struct {
	Analytic  num   `json:"analytic"`
	Simulated num   `json:"simulated"`
	CILow     num   `json:"ci_low"`
	CIHigh    num   `json:"ci_high"`
	Inside    *bool `json:"analytic_inside_ci"`
}

type simulateJSON struct {
	Nodes          int          `json:"nodes"`
	SGSize         int          `json:"sg_size"`
	Layout         string       `json:"layout"`
	Mode           string       `json:"mode"`
	Tolerance      int          `json:"tolerance"`
	Trials         int          `json:"trials"`
	Confidence     float64      `json:"confidence"`
	Days           float64      `json:"days"`
	Reft           estimateJSON `json:"reft"`
	Checkpoint     estimateJSON `json:"checkpoint"`
	ReftDays       estimateJSON `json:"reft_days"`
	CheckpointDays estimateJSON `json:"checkpoint_days"`
	Seconds        float64      `json:"seconds"`
}

func estimate(an float64, hasAn bool, e Estimate) estimateJSON {
	j := estimateJSON{Simulated: opt(e.P), CILow: opt(e.Low), CIHigh: opt(e.High)}
	if hasAn {
		j.Analytic = opt(an)
		in := an >= e.Low && an <= e.High // an infinite bound still brackets
		j.Inside = &in
	}
	return j
}

func runSimulate(args []string, stdout, stderr io.Writer) error {
	var out output
	fs := newFlags("simulate", stderr, &out)
	var s Simulation
	fs.IntVar(&s.Nodes, "nodes", 3072, fmt.Sprintf("nodes in the job, at most %d", MaxSimNodes))
	fs.IntVar(&s.SGSize, "sg-size", 6, "members per sharding group (the DP degree)")
	fs.IntVar(&s.GPUsPerNode, "gpus-per-node", 8, "GPUs per node (matters for --layout packed)")
	fs.StringVar(&s.Layout, "layout", "spread", "spread: SG members on distinct nodes (reft's layout); packed: on consecutive GPUs")
	fs.Float64Var(&s.Shape, "shape", 1.3, "Weibull shape C")
	fs.Float64Var(&s.HWRate, "hw-rate", 1e-4, "hardware failures per node per day^C")
	fs.Float64Var(&s.SWRate, "sw-rate", 1e-5, "software failures per node per day^C")
	fs.Float64Var(&s.AgentRate, "agent-rate", 0, "reft agent failures per node per day^C")
	modeSpec := fs.String("mode", "arc", "protection SPEC, as for survival")
	threshold := fs.Float64("threshold", 0.9, "survival probability for the time-above-threshold estimate")
	days := fs.Float64("days", 0, "day at which to compare simulated and analytic survival (default: the analytic time above --threshold)")
	fs.IntVar(&s.Trials, "trials", 10000, "Monte Carlo trials")
	seed := fs.Uint64("seed", 1, "random seed; the same seed gives the same result")
	conf := fs.Float64("confidence", 0.99, "confidence level of the intervals")
	if err := parse(fs, args); err != nil {
		return err
	}
	s.Seed = *seed
	mode, err := applyMode(*modeSpec, s.SGSize, &s.Tolerance, func() error { return s.validate() }, *threshold)
	if err != nil {
		return err
	}
	if !(*conf > 0 && *conf < 1) {
		return fmt.Errorf("--confidence must lie strictly between 0 and 1, as in 0.99; got %g", *conf)
	}
	if *days < 0 {
		return fmt.Errorf("--days must be >= 0; got %g", *days)
	}
	start := time.Now()
	res := s.Run()
	elapsed := time.Since(start)
	an, hasAn := s.Analytic()
	t := *days
	if t == 0 {
		if hasAn {
			t = an.ReftDays(*threshold)
		} else {
			t = DaysAbove(res.Reft, *threshold, *conf).P
		}
		if math.IsInf(t, 0) {
			t = 1
		}
	}
	j := simulateJSON{
		Nodes: s.Nodes, SGSize: s.SGSize, Layout: s.Layout, Mode: mode.Spec, Tolerance: s.Tolerance,
		Trials: s.Trials, Confidence: *conf, Days: t, Seconds: elapsed.Seconds(),
	}
	var anReft, anCk, anRD, anCD float64
	if hasAn {
		anReft, anCk = an.Reft(t), an.Checkpoint(t)
		anRD, anCD = an.ReftDays(*threshold), an.CheckpointDays(*threshold)
	}
	j.Reft = estimate(anReft, hasAn, At(res.Reft, t, *conf))
	j.Checkpoint = estimate(anCk, hasAn, At(res.Checkpoint, t, *conf))
	j.ReftDays = estimate(anRD, hasAn, DaysAbove(res.Reft, *threshold, *conf))
	j.CheckpointDays = estimate(anCD, hasAn, DaysAbove(res.Checkpoint, *threshold, *conf))
	if out.plot != "" {
		p, err := simulatePlot(s, res, an, hasAn, *conf)
		if err != nil {
			return err
		}
		if err := savePlot(p, out.plot); err != nil {
			return err
		}
	}
	if out.json {
		return writeJSON(stdout, j)
	}
	fmt.Fprintf(stdout, "Monte Carlo survival: %d nodes, %d distinct sharding groups of %d (%s layout), mode %s (tolerance %d)\n",
		s.Nodes, res.Groups, s.SGSize, s.Layout, mode.Spec, s.Tolerance)
	fmt.Fprintf(stdout, "%d trials in %.2f s; intervals at %g %% confidence\n\n", s.Trials, elapsed.Seconds(), 100**conf)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "quantity\tanalytic\tsimulated\tinterval\tinside\t")
	show := func(f string, v num) string {
		if v == nil {
			return "never"
		}
		return fmt.Sprintf(f, *v)
	}
	row := func(name string, e estimateJSON, f string) {
		a, in := "n/a", "n/a"
		if e.Inside != nil {
			a = show(f, e.Analytic)
			in = map[bool]string{true: "yes", false: "NO"}[*e.Inside]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t[%s, %s]\t%s\t\n", name, a, show(f, e.Simulated), show(f, e.CILow), show(f, e.CIHigh), in)
	}
	row(fmt.Sprintf("P(reft survives %.3g days)", t), j.Reft, "%.4f")
	row(fmt.Sprintf("P(no failure in %.3g days)", t), j.Checkpoint, "%.4f")
	row(fmt.Sprintf("reft days above %g", *threshold), j.ReftDays, "%.4g")
	row(fmt.Sprintf("checkpoint days above %g", *threshold), j.CheckpointDays, "%.4g")
	tw.Flush()
	if !hasAn {
		fmt.Fprintf(stdout, "\nNo closed form for this packed layout; the simulated values stand alone.\n")
	}
	return nil
}
