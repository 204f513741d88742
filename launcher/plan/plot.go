package plan

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// savePlot writes p as PNG or SVG, chosen by the file's extension.
func savePlot(p *plot.Plot, file string) error {
	switch strings.ToLower(filepath.Ext(file)) {
	case ".png", ".svg":
	default:
		return fmt.Errorf("--plot %q: the file must end in .png or .svg", file)
	}
	if err := p.Save(9*vg.Inch, 5.5*vg.Inch, file); err != nil {
		return fmt.Errorf("--plot %q: %w", file, err)
	}
	return nil
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Add(plotter.NewGrid())
	return p
}

func logX(p *plot.Plot) {
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
}

// addLine adds one styled curve with a legend entry.
func addLine(p *plot.Plot, name string, xys plotter.XYs, c color.Color, dashes []vg.Length) error {
	l, err := plotter.NewLine(xys)
	if err != nil {
		return err
	}
	l.Color = c
	l.Width = vg.Points(1.6)
	l.Dashes = dashes
	p.Add(l)
	if name != "" {
		p.Legend.Add(name, l)
	}
	return nil
}

// thresholdLine draws a horizontal dotted reference at y over [x0, x1].
func thresholdLine(p *plot.Plot, name string, y, x0, x1 float64) error {
	return addLine(p, name, plotter.XYs{{X: x0, Y: y}, {X: x1, Y: y}}, color.Gray{Y: 90}, []vg.Length{vg.Points(2), vg.Points(3)})
}

// logSpace returns n points from a to b, evenly spaced on a log axis.
func logSpace(a, b float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = a * math.Pow(b/a, float64(i)/float64(n-1))
	}
	return out
}

var dashed = []vg.Length{vg.Points(6), vg.Points(3)}

// survivalPlot is REFT Fig. 8: survival with reft (solid) and with
// checkpointing alone (dashed) for several shapes, time on a log axis so
// both the hours of one and the weeks of the other show.
func survivalPlot(base Survival, shapes []float64, threshold float64, mode string) (*plot.Plot, error) {
	p := newPlot(fmt.Sprintf("In-memory state survival: %d units, SG size %d, mode %s", base.Units, base.SGSize, mode),
		"time since last persistent checkpoint (days)", "probability state survives")
	logX(p)
	p.Y.Min, p.Y.Max = 0, 1.02
	p.Legend.Left = true // curves fall from the top left; the bottom left stays empty
	ts := logSpace(0.01, 1000, 300)
	for i, c := range shapes {
		s := base
		s.Shape = c
		var re, ck plotter.XYs
		for _, t := range ts {
			re = append(re, plotter.XY{X: t, Y: s.Reft(t)})
			ck = append(ck, plotter.XY{X: t, Y: s.Checkpoint(t)})
		}
		col := plotutil.Color(i)
		if err := addLine(p, fmt.Sprintf("reft, c=%g (%.3g days)", c, s.ReftDays(threshold)), re, col, nil); err != nil {
			return nil, err
		}
		if err := addLine(p, fmt.Sprintf("checkpoint only, c=%g (%.3g days)", c, s.CheckpointDays(threshold)), ck, col, dashed); err != nil {
			return nil, err
		}
	}
	if err := thresholdLine(p, fmt.Sprintf("threshold %g", threshold), threshold, ts[0], ts[len(ts)-1]); err != nil {
		return nil, err
	}
	return p, nil
}

// placementPlot shows recovery probability against simultaneous failures.
func placementPlot(pl Placement) (*plot.Plot, error) {
	p := newPlot(fmt.Sprintf("Recovery from CPU memory: %d machines, %d replicas", pl.Nodes, pl.Replicas),
		"machines failed at once (k)", "probability of recovery from CPU memory")
	p.Y.Min, p.Y.Max = 0, 1.02
	p.Legend.Left = true
	kmax := min(pl.Nodes, max(3*pl.Replicas, pl.Failures+2))
	if kmax <= 24 {
		var ticks []plot.Tick
		for k := 0; k <= kmax; k++ {
			ticks = append(ticks, plot.Tick{Value: float64(k), Label: fmt.Sprint(k)})
		}
		p.X.Tick.Marker = plot.ConstantTicks(ticks)
	}
	var mixed, ring, bound plotter.XYs
	step := max(1, kmax/40) // each point costs O(N k m); 40 draw the curve well
	for k := 0; k <= kmax; k += step {
		q := pl
		q.Failures = k
		mixed = append(mixed, plotter.XY{X: float64(k), Y: q.Recovery()})
		ring = append(ring, plotter.XY{X: float64(k), Y: q.Ring()})
		if b := q.CorollaryBound(); !math.IsNaN(b) {
			bound = append(bound, plotter.XY{X: float64(k), Y: b})
		}
	}
	name := "group placement"
	if _, r := pl.Layout(); r > 0 {
		name = "mixed placement"
	}
	for i, c := range []struct {
		name string
		xys  plotter.XYs
		d    []vg.Length
	}{{name, mixed, nil}, {"ring placement", ring, nil}, {"GEMINI Corollary 1 bound", bound, dashed}} {
		if len(c.xys) == 0 {
			continue
		}
		if err := addLine(p, c.name, c.xys, plotutil.Color(i), c.d); err != nil {
			return nil, err
		}
		s, err := plotter.NewScatter(c.xys)
		if err != nil {
			return nil, err
		}
		s.Color = plotutil.Color(i)
		s.Shape = draw.CircleGlyph{}
		p.Add(s)
	}
	return p, nil
}

// intervalPlot shows how the wasted fraction grows with the job's size.
func intervalPlot(iv Interval) (*plot.Plot, error) {
	p := newPlot(fmt.Sprintf("Wasted time at the optimal checkpoint interval (o=%gs, r=%gs, f=%g/GPU-day)", iv.CheckpointSeconds, iv.RestartSeconds, iv.FailuresPerGPUDay),
		"GPUs in the job", "wasted share of wall time (%)")
	logX(p)
	p.Legend.Top, p.Legend.Left = true, true // the curves rise to the right
	top := math.Max(16384, float64(iv.GPUs)*4)
	var per, rf plotter.XYs
	last := 0
	for _, x := range logSpace(1, top, 200) {
		n := int(math.Round(x))
		if n == last {
			continue // GPUs come in whole numbers; skip repeats at the small end
		}
		last = n
		q := iv
		q.GPUs = n
		per = append(per, plotter.XY{X: float64(n), Y: 100 * q.WastedFraction()})
		if iv.StepSeconds > 0 {
			rf = append(rf, plotter.XY{X: float64(n), Y: 100 * q.ReftWastedFraction()})
		}
	}
	if err := addLine(p, "periodic checkpoints at c* (JIT Eq. 6)", per, plotutil.Color(0), nil); err != nil {
		return nil, err
	}
	if len(rf) > 0 {
		if err := addLine(p, fmt.Sprintf("reft: one %gs step + restart per failure", iv.StepSeconds), rf, plotutil.Color(1), nil); err != nil {
			return nil, err
		}
	}
	mark, err := plotter.NewScatter(plotter.XYs{{X: float64(iv.GPUs), Y: 100 * iv.WastedFraction()}})
	if err != nil {
		return nil, err
	}
	mark.Shape = draw.CircleGlyph{}
	mark.Radius = vg.Points(4)
	p.Add(mark)
	p.Legend.Add(fmt.Sprintf("this job: %d GPUs, %.3g checkpoints/hour", iv.GPUs, iv.PerHour()), mark)
	return p, nil
}

// memoryPlot compares the node's snapshot footprint across common modes
// with REFT's 3x bound and the node's RAM.
func memoryPlot(mm Memory) (*plot.Plot, error) {
	specs := []string{"off", "arc", "aec", "aec:2", "arc+aec", "aor"}
	if !containsString(specs, mm.Mode.Spec) {
		specs = append(specs, mm.Mode.Spec)
	}
	var own, red plotter.Values
	var names []string
	for _, spec := range specs {
		md, err := ParseMode(spec)
		if err != nil {
			return nil, err
		}
		if md.Tolerance() >= mm.DP && md.Tolerance() > 0 {
			continue // this DP group is too small for the mode
		}
		q := mm
		q.Mode = md
		r := q.Plan()
		g := float64(mm.GPUsPerNode*mm.Generations) / (1 << 30)
		own = append(own, r.OwnPerRank*g)
		red = append(red, r.RedunPerRank*g)
		names = append(names, spec)
	}
	p := newPlot(fmt.Sprintf("Host memory per node for snapshots: %.3g params, dp=%d pp=%d tp=%d, %d GPUs/node", mm.Params, mm.DP, mm.PP, mm.TP, mm.GPUsPerNode),
		"protection mode", "GiB per node")
	w := vg.Points(28)
	b1, err := plotter.NewBarChart(own, w)
	if err != nil {
		return nil, err
	}
	b1.Color = plotutil.Color(0)
	b2, err := plotter.NewBarChart(red, w)
	if err != nil {
		return nil, err
	}
	b2.Color = plotutil.Color(1)
	b2.StackOn(b1)
	p.Add(b1, b2)
	p.Legend.Add(fmt.Sprintf("own shards (%d generations)", mm.Generations), b1)
	p.Legend.Add("redundancy", b2)
	p.NominalX(names...)
	r := mm.Plan()
	x0, x1 := -0.5, float64(len(names))-0.5
	if err := addLine(p, "REFT bound: 3x model+optimizer state", plotter.XYs{{X: x0, Y: r.Bound / (1 << 30)}, {X: x1, Y: r.Bound / (1 << 30)}}, color.RGBA{R: 200, A: 255}, dashed); err != nil {
		return nil, err
	}
	if err := thresholdLine(p, fmt.Sprintf("node RAM %g GiB", mm.NodeRAMGiB), mm.NodeRAMGiB, x0, x1); err != nil {
		return nil, err
	}
	p.Y.Min = 0
	// Leave room above the RAM line for the legend.
	p.Y.Max = 1.3 * math.Max(mm.NodeRAMGiB, r.Bound/(1<<30))
	p.Legend.Top, p.Legend.Left = true, true
	return p, nil
}

func containsString(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

// errPoints carries simulated estimates with asymmetric Wilson intervals.
type errPoints struct {
	plotter.XYs
	plotter.YErrors
}

// simulatePlot overlays the simulated survival (points with intervals) on
// the analytic curves.
func simulatePlot(s Simulation, res SimResult, an Survival, hasAn bool, conf float64) (*plot.Plot, error) {
	p := newPlot(fmt.Sprintf("Monte Carlo survival: %d nodes, SG size %d (%s), tolerance %d, %d trials", s.Nodes, s.SGSize, s.Layout, s.Tolerance, s.Trials),
		"days", "probability state survives")
	logX(p)
	p.Y.Min, p.Y.Max = 0, 1.02
	p.Legend.Left = true
	// Span the losses actually drawn; a rate of zero draws none (+Inf).
	lo := math.Max(1e-3, res.Checkpoint[len(res.Checkpoint)/100])
	if math.IsInf(lo, 1) {
		lo = 1e-3
	}
	hi := math.Max(lo*10, res.Reft[len(res.Reft)*99/100])
	if math.IsInf(hi, 1) {
		hi = lo * 1e4
	}
	ts := logSpace(lo/3, hi*2, 160)
	for i, series := range []struct {
		name   string
		sorted []float64
		curve  func(float64) float64
	}{{"reft", res.Reft, an.Reft}, {"checkpoint only", res.Checkpoint, an.Checkpoint}} {
		col := plotutil.Color(i)
		if hasAn {
			var xys plotter.XYs
			for _, t := range ts {
				xys = append(xys, plotter.XY{X: t, Y: series.curve(t)})
			}
			if err := addLine(p, series.name+", analytic", xys, col, nil); err != nil {
				return nil, err
			}
		}
		var ep errPoints
		for _, t := range logSpace(lo/3, hi*2, 24) {
			e := At(series.sorted, t, conf)
			ep.XYs = append(ep.XYs, plotter.XY{X: t, Y: e.P})
			ep.YErrors = append(ep.YErrors, struct{ Low, High float64 }{e.P - e.Low, e.High - e.P})
		}
		sc, err := plotter.NewScatter(ep.XYs)
		if err != nil {
			return nil, err
		}
		sc.Color, sc.Shape = col, draw.CircleGlyph{}
		eb, err := plotter.NewYErrorBars(ep)
		if err != nil {
			return nil, err
		}
		eb.Color = col
		p.Add(sc, eb)
		p.Legend.Add(series.name+", simulated with interval", sc)
	}
	return p, nil
}
