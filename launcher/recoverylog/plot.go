package recoverylog

import (
	"cmp"
	"fmt"
	"image/color"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/reft-hpc/reft/pmix/hostlist"
)

// RunLane is the plot's lane for reft run's job-wide decisions (launch,
// relaunch, resumed, the end), above the nodes' lanes.
const RunLane = "reft run"

// Legend entries of the timeline picture (the tests look for them).
const (
	legendFailure   = "failure detected"
	legendDetection = "detection: last sign of life to verdict"
	legendExcluded  = "node excluded"
	legendRun       = "reft run: launch, relaunch, resumed, end"
)

// restoreLegend names each restore event's source in the legend.
var restoreLegend = map[string]string{
	RestoreLocal:      "restore from local tmpfs",
	RestorePeer:       "restore from a peer",
	Decode:            "restore by decoding parity",
	RestorePersistent: "restore from persistent copy",
}

// SavePlot draws rep's timeline as a picture, PNG or SVG by file's
// extension: one lane per node with each Slurm step's span on it (extern
// and probe steps left out, as in the text), the failure and its
// detection (from the failed agent's last sign of life when the agents
// detected it), the node's exclusion, each node's restore by source with
// its bytes, and reft run's launches, relaunches, resume and end on a lane
// of their own. Times are seconds since the job started.
func SavePlot(rep Report, file string) error {
	switch strings.ToLower(filepath.Ext(file)) {
	case ".png", ".svg":
	default:
		return fmt.Errorf("--plot %q: the file must end in .png or .svg", file)
	}
	p, err := timelinePlot(rep)
	if err != nil {
		return fmt.Errorf("--plot %q: %w", file, err)
	}
	if err := p.Save(11*vg.Inch, 6*vg.Inch, file); err != nil {
		return fmt.Errorf("--plot %q: %w", file, err)
	}
	return nil
}

// lanes are the plot's rows: the run lane on top, then the nodes in
// natural order (n2 before n10).
type lanes struct {
	y map[string]float64
}

func (l lanes) at(node string) (float64, bool) {
	y, ok := l.y[node]
	return y, ok
}

// naturalCmp orders node names by their text and then by their trailing
// number, so n2 comes before n10.
func naturalCmp(a, b string) int {
	pa, na := splitNum(a)
	pb, nb := splitNum(b)
	if c := cmp.Compare(pa, pb); c != 0 {
		return c
	}
	if c := cmp.Compare(na, nb); c != 0 {
		return c
	}
	return cmp.Compare(a, b)
}

func splitNum(s string) (string, int) {
	i := len(s)
	for i > 0 && s[i-1] >= '0' && s[i-1] <= '9' {
		i--
	}
	n, _ := strconv.Atoi(s[i:])
	return s[:i], n
}

// nodesOf lists every node the timeline names.
func nodesOf(tl []Entry) []string {
	set := map[string]bool{}
	for _, e := range tl {
		if r := e.Sacct; r != nil && !r.IsJob() && r.NodeList != "" {
			if ns, err := hostlist.Expand(r.NodeList); err == nil {
				for _, n := range ns {
					set[n] = true
				}
			}
		}
		if ev := e.Recovery; ev != nil {
			for _, n := range append([]string{ev.Node, ev.Replacement}, ev.Nodes...) {
				if n != "" {
					set[n] = true
				}
			}
		}
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	slices.SortFunc(out, naturalCmp)
	return out
}

// timelinePlot builds the picture SavePlot writes.
func timelinePlot(rep Report) (*plot.Plot, error) {
	tl := rep.Timeline
	if len(tl) == 0 {
		return nil, fmt.Errorf("job %s: nothing to draw (no sacct record with a start, no recovery event)", rep.Job)
	}
	t0 := tl[0].Time // the timeline is in time order; the job's start when sacct has it
	end := tl[len(tl)-1].Time
	sec := func(t time.Time) float64 { return t.Sub(t0).Seconds() }

	nodes := nodesOf(tl)
	ln := lanes{y: map[string]float64{RunLane: float64(len(nodes))}}
	ticks := []plot.Tick{{Value: float64(len(nodes)), Label: RunLane}}
	for i, n := range nodes {
		y := float64(len(nodes) - 1 - i)
		ln.y[n] = y
		ticks = append(ticks, plot.Tick{Value: y, Label: n})
	}

	p := plot.New()
	p.Title.Text = fmt.Sprintf("reft log %s: recovery timeline (%s)", rep.Job, orNone(rep.State))
	p.X.Label.Text = fmt.Sprintf("seconds since %s", t0.Local().Format("2006-01-02 15:04:05"))
	p.Y.Label.Text = "node"
	p.Y.Tick.Marker = plot.ConstantTicks(ticks)
	p.Y.Min, p.Y.Max = -0.8, float64(len(nodes))+0.8
	p.X.Min = 0
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.Left = false
	p.Legend.TextStyle.Font.Size = vg.Points(9)

	// Step spans: one thick bar per node of the step, the same color for
	// every node of one step. A step still running ends at the last entry.
	steps := map[string]*Record{}
	var stepOrder []string
	for _, e := range tl {
		if r := e.Sacct; r != nil && !r.IsJob() && r.StepID() != "batch" {
			if _, ok := steps[r.JobID]; !ok {
				steps[r.JobID] = r
				stepOrder = append(stepOrder, r.JobID)
			}
		}
	}
	for i, id := range stepOrder {
		r := steps[id]
		if r.Start.IsZero() {
			continue
		}
		stop := r.End
		if stop.IsZero() {
			stop = end
		}
		ns, err := hostlist.Expand(r.NodeList)
		if err != nil {
			continue // sacct's own list; Timeline printed it as it came
		}
		col := plotutil.Color(i % 7)
		for k, n := range ns {
			y, ok := ln.at(n)
			if !ok {
				continue
			}
			l, err := plotter.NewLine(plotter.XYs{{X: sec(r.Start), Y: y - 0.18}, {X: sec(stop), Y: y - 0.18}})
			if err != nil {
				return nil, err
			}
			l.Color = col
			l.Width = vg.Points(7)
			l.LineStyle.Dashes = nil
			p.Add(l)
			if k == 0 {
				p.Legend.Add(fmt.Sprintf("step %s (%s) %s", id, r.Name, strings.ToLower(r.State)), l)
			}
		}
	}

	// Events: markers by kind, a label each.
	type mark struct {
		x, y  float64
		label string
	}
	groups := map[string][]mark{}
	var det []plotter.XYs
	for _, e := range tl {
		ev := e.Recovery
		if ev == nil {
			continue
		}
		x := sec(ev.Time)
		switch ev.Event {
		case FailureDetected:
			failed := ev.Nodes
			if len(failed) == 0 && ev.Node != "" {
				failed = []string{ev.Node}
			}
			for _, n := range failed {
				y, ok := ln.at(n)
				if !ok {
					continue
				}
				groups[legendFailure] = append(groups[legendFailure], mark{x, y, "failure: " + cmp.Or(ev.Kind, "?")})
				if ev.DetectionS != nil && *ev.DetectionS > 0 {
					det = append(det, plotter.XYs{{X: x - *ev.DetectionS, Y: y + 0.12}, {X: x, Y: y + 0.12}})
				}
			}
			if len(failed) == 0 {
				groups[legendFailure] = append(groups[legendFailure], mark{x, ln.y[RunLane], "failure: " + cmp.Or(ev.Kind, "?")})
			}
		case NodeExcluded:
			if y, ok := ln.at(ev.Node); ok {
				label := "excluded"
				if ev.Replacement != "" {
					label += ", spare " + ev.Replacement + " takes its ranks"
				}
				groups[legendExcluded] = append(groups[legendExcluded], mark{x, y, label})
			}
		case RestoreLocal, RestorePeer, Decode, RestorePersistent:
			if y, ok := ln.at(ev.Node); ok {
				label := fmt.Sprintf("%s %s", strings.TrimPrefix(restoreLegend[ev.Event], "restore "), bytesText(ev.Bytes))
				groups[restoreLegend[ev.Event]] = append(groups[restoreLegend[ev.Event]], mark{x, y, label})
			}
		default:
			label := ev.Event
			switch ev.Event {
			case StepLaunched:
				label = "launched"
			case StepRelaunched:
				label = fmt.Sprintf("relaunch %d", ev.Relaunch)
			case Resumed:
				if ev.Generation >= 0 {
					label = fmt.Sprintf("resumed from step %d", ev.Generation)
					if ev.LostSteps != nil {
						label += fmt.Sprintf(", lost %d", *ev.LostSteps)
					}
				} else {
					label = "started over"
				}
			}
			groups[legendRun] = append(groups[legendRun], mark{x, ln.y[RunLane], label})
		}
	}
	for _, xys := range det {
		l, err := plotter.NewLine(xys)
		if err != nil {
			return nil, err
		}
		l.Color = color.RGBA{R: 220, A: 255}
		l.Width = vg.Points(2)
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
		p.Add(l)
		if len(det) > 0 && xys[0] == det[0][0] {
			p.Legend.Add(legendDetection, l)
		}
	}
	styles := map[string]struct {
		shape draw.GlyphDrawer
		col   color.Color
	}{
		legendFailure:                    {draw.CrossGlyph{}, color.RGBA{R: 220, A: 255}},
		legendExcluded:                   {draw.SquareGlyph{}, color.Gray{Y: 40}},
		legendRun:                        {draw.TriangleGlyph{}, color.RGBA{G: 110, B: 200, A: 255}},
		restoreLegend[RestoreLocal]:      {draw.CircleGlyph{}, color.RGBA{G: 150, A: 255}},
		restoreLegend[RestorePeer]:       {draw.CircleGlyph{}, color.RGBA{R: 20, G: 170, B: 170, A: 255}},
		restoreLegend[Decode]:            {draw.RingGlyph{}, color.RGBA{R: 150, B: 200, A: 255}},
		restoreLegend[RestorePersistent]: {draw.PyramidGlyph{}, color.RGBA{R: 200, G: 120, A: 255}},
	}
	order := []string{legendRun, legendFailure, legendExcluded, restoreLegend[RestoreLocal], restoreLegend[RestorePeer],
		restoreLegend[Decode], restoreLegend[RestorePersistent]}
	for _, name := range order {
		ms := groups[name]
		if len(ms) == 0 {
			continue
		}
		xys := make(plotter.XYs, len(ms))
		lxy := plotter.XYLabels{XYs: make(plotter.XYs, len(ms)), Labels: make([]string, len(ms))}
		for i, m := range ms {
			xys[i] = plotter.XY{X: m.x, Y: m.y}
			lxy.XYs[i] = plotter.XY{X: m.x, Y: m.y + 0.08}
			lxy.Labels[i] = m.label
		}
		s, err := plotter.NewScatter(xys)
		if err != nil {
			return nil, err
		}
		st := styles[name]
		s.GlyphStyle = draw.GlyphStyle{Shape: st.shape, Color: st.col, Radius: vg.Points(4.5)}
		p.Add(s)
		p.Legend.Add(name, s)
		labels, err := plotter.NewLabels(lxy)
		if err != nil {
			return nil, err
		}
		for i := range labels.TextStyle {
			labels.TextStyle[i].Font.Size = vg.Points(8)
			labels.TextStyle[i].Rotation = 0.35 // slanted: neighbours in time overlap less
		}
		labels.Offset = vg.Point{X: vg.Points(3), Y: vg.Points(4)}
		p.Add(labels)
	}
	// Room on the right for the last event's label and the legend.
	p.X.Max = sec(end) * 1.45
	if p.X.Max <= 0 {
		p.X.Max = 1
	}
	return p, nil
}
