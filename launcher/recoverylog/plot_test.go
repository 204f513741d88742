package recoverylog

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// plotReport is a node loss under reft run with a spare: the job's steps
// from sacct, and the recovery events of the loss of n3 (detected by the
// agents 2.1 s after its last sign of life), n3 excluded for the spare n5,
// the relaunch, the restores (n5 from a peer, the others from their own
// tmpfs), the resume and the end.
func plotReport(t *testing.T) Report {
	t.Helper()
	const out = `180|rjob.sh|COMPLETED|0:0|2026-11-21T22:00:00|2026-11-21T22:00:40|00:00:40|5|n[1-5]|
180.batch|batch|COMPLETED|0:0|2026-11-21T22:00:00|2026-11-21T22:00:40|00:00:40|1|n1|
180.extern|extern|COMPLETED|0:0|2026-11-21T22:00:00|2026-11-21T22:00:40|00:00:40|5|n[1-5]|
180.0|reft-train|FAILED|1:0|2026-11-21T22:00:01|2026-11-21T22:00:15|00:00:14|4|n[1-4]|
180.1|reft-probe|COMPLETED|0:0|2026-11-21T22:00:15|2026-11-21T22:00:16|00:00:01|4|n[1-2,4-5]|
180.2|reft-train|COMPLETED|0:0|2026-11-21T22:00:17|2026-11-21T22:00:39|00:00:22|4|n[1-2,4-5]|
`
	recs, err := ParseSacct(out, time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	at := func(s float64) time.Time {
		return time.Date(2026, 11, 21, 22, 0, 0, 0, time.UTC).Add(time.Duration(s * float64(time.Second)))
	}
	det, lost := 2.1, int64(1)
	events := []Event{
		{Time: at(1.2), Event: StepLaunched, Step: "180.0", Nodes: []string{"n1", "n2", "n3", "n4"}, Spec: "arc", Generation: -1},
		{Time: at(14.6), Event: FailureDetected, Step: "180.0", Kind: KindNode, Nodes: []string{"n3"}, Ranks: []int{2}, Generation: 41,
			DetectedBy: "agents", DetectionS: &det, Cause: "n3 is DOWN"},
		{Time: at(16.4), Event: NodeExcluded, Node: "n3", Replacement: "n5", Generation: -1},
		{Time: at(17.0), Event: StepRelaunched, Step: "180.2", Relaunch: 1, Nodes: []string{"n1", "n2", "n5", "n4"}, Generation: -1},
		{Time: at(19.5), Event: RestoreLocal, Node: "n1", Ranks: []int{0}, Generation: 41, Bytes: 256 << 10},
		{Time: at(19.6), Event: RestorePeer, Node: "n5", Ranks: []int{2}, Generation: 41, Bytes: 1 << 20},
		{Time: at(20.0), Event: Resumed, Generation: 41, LostSteps: &lost},
		{Time: at(39.0), Event: Completed, Relaunch: 1, Generation: -1},
	}
	return Report{Job: "180", State: "COMPLETED", Timeline: Timeline(recs, events)}
}

// TestPlot draws the timeline as PNG and SVG, as reft plan's plots are
// tested: the PNG decodes at a sensible size, the SVG carries the title,
// the axis labels, a lane per node and reft run's lane, the legend (the
// steps shown, the extern and probe steps not) and every event's label.
func TestPlot(t *testing.T) {
	rep := plotReport(t)
	dir := t.TempDir()
	pngFile, svgFile := filepath.Join(dir, "t.png"), filepath.Join(dir, "t.svg")
	for _, f := range []string{pngFile, svgFile} {
		if err := SavePlot(rep, f); err != nil {
			t.Fatal(err)
		}
	}
	fh, err := os.Open(pngFile)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	st, _ := fh.Stat()
	img, err := png.Decode(fh)
	if err != nil {
		t.Fatalf("PNG does not decode: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 600 || b.Dy() < 300 || st.Size() < 10_000 {
		t.Errorf("PNG is %dx%d, %d bytes; too small to hold the timeline", b.Dx(), b.Dy(), st.Size())
	}
	b, err := os.ReadFile(svgFile)
	if err != nil {
		t.Fatal(err)
	}
	svg := string(b)
	for _, want := range []string{
		"reft log 180: recovery timeline (COMPLETED)", "seconds since 2026-11-21", "node",
		">n1<", ">n2<", ">n3<", ">n4<", ">n5<", ">" + RunLane + "<",
		"step 180.0 (reft-train) failed", "step 180.2 (reft-train) completed",
		legendFailure, legendDetection, legendExcluded, legendRun, restoreLegend[RestoreLocal], restoreLegend[RestorePeer],
		"failure: node", "excluded, spare n5 takes its ranks", "launched", "relaunch 1", "resumed from step 41, lost 1", "completed",
		"from local tmpfs 256.0 KiB", "from a peer 1.0 MiB",
	} {
		if !strings.Contains(svg, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	for _, never := range []string{"extern", "reft-probe", "180.batch", restoreLegend[Decode]} {
		if strings.Contains(svg, never) {
			t.Errorf("SVG shows %q, which the timeline leaves out or did not happen", never)
		}
	}
}

// TestPlotErrors: a file that is neither .png nor .svg, and a report with
// nothing to draw, are refused with the reason.
func TestPlotErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		rep  Report
		file string
		want string
	}{
		{plotReport(t), filepath.Join(dir, "t.pdf"), "must end in .png or .svg"},
		{Report{Job: "7"}, filepath.Join(dir, "t.svg"), "job 7: nothing to draw"},
		{plotReport(t), filepath.Join(dir, "missing", "t.svg"), "no such file or directory"},
	} {
		if err := SavePlot(tc.rep, tc.file); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("SavePlot(%s): %v, want an error naming %q", tc.file, err, tc.want)
		}
	}
}

// TestCommandPlot: reft log --plot draws the file besides printing the
// timeline, and refuses a bad extension before asking Slurm anything.
func TestCommandPlot(t *testing.T) {
	logDir := t.TempDir()
	w, err := Open(logDir, "174")
	if err != nil {
		t.Fatal(err)
	}
	w.Write(Event{Time: time.Date(2026, 11, 21, 21, 58, 30, 168e6, time.Local), Job: "174", Step: "174.0", Event: FailureDetected,
		Kind: KindRank, Nodes: []string{"n3"}, Ranks: []int{2}, Cause: "task 2 on n3: Killed", Generation: 6})
	w.Close()
	sacct, scontrol := fakeTools(t, "cat <<'EOF'\n"+sacctOut+"EOF\n", "exit 1")
	file := filepath.Join(t.TempDir(), "174.svg")
	var out, errb bytes.Buffer
	if code := Command([]string{"--log-dir", logDir, "--sacct", sacct, "--scontrol", scontrol, "--plot", file, "174"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	svg, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(svg), "reft log 174: recovery timeline") || !strings.Contains(string(svg), "failure: rank") ||
		!strings.Contains(out.String(), "failure: rank 2 on n3") || !strings.Contains(errb.String(), "drew the timeline into "+file) {
		t.Errorf("--plot: stdout %q stderr %q, SVG %d bytes", out.String(), errb.String(), len(svg))
	}
	errb.Reset()
	if code := Command([]string{"--sacct", "/nonexistent", "--plot", "x.jpg", "174"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "must end in .png or .svg") {
		t.Errorf("--plot x.jpg: exit %d, stderr %q", code, errb.String())
	}
}
