package plan

import (
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPlots draws every subcommand's figure as PNG and SVG. A PNG must
// decode at a sensible size; an SVG must be an SVG that carries the legend
// entries, the title and both axis labels, which proves the curves were
// labelled (the survival figure with every Fig. 8 shape).
func TestPlots(t *testing.T) {
	tests := []struct {
		name string
		args []string
		// legend entries, then the title and the axis labels
		legend []string
	}{
		{"survival", []string{"survival"}, []string{"reft, c=1.3 (16.2 days)", "checkpoint only, c=1.3 (0.408 days)", "In-memory state survival: 3072 units", "time since last persistent checkpoint (days)", "probability state survives",
			"reft, c=1 (", "reft, c=2 (", "checkpoint only, c=2 ("}},
		{"placement", []string{"placement", "--nodes", "17", "--replicas", "2", "--failures", "3"}, []string{"mixed placement", "ring placement", "Recovery from CPU memory: 17 machines, 2 replicas", "machines failed at once (k)", "probability of recovery from CPU memory"}},
		{"placement-group", []string{"placement"}, []string{"group placement", "GEMINI Corollary 1 bound", "machines failed at once (k)"}},
		{"interval", []string{"interval", "--gpus", "1024", "--checkpoint-seconds", "5", "--restart-seconds", "9.9", "--step-seconds", "2"}, []string{"periodic checkpoints at c*", "reft: one 2s step", "this job: 1024 GPUs", "Wasted time at the optimal checkpoint interval", "GPUs in the job", "wasted share of wall time (%)"}},
		{"memory", []string{"memory", "--params", "7B", "--dp", "4", "--tp", "8"}, []string{"own shards", "redundancy", "REFT bound", "Host memory per node for snapshots", "protection mode", "GiB per node"}},
		{"simulate", []string{"simulate", "--nodes", "120", "--hw-rate", "1e-3", "--trials", "300"}, []string{"reft, analytic", "reft, simulated with interval", "checkpoint only, analytic", "Monte Carlo survival: 120 nodes", "days", "probability state survives"}},
	}
	dir := t.TempDir()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pngFile := filepath.Join(dir, tc.name+".png")
			svgFile := filepath.Join(dir, tc.name+".svg")
			for _, f := range []string{pngFile, svgFile} {
				if code, _, errs := run(append(tc.args, "--plot", f)...); code != 0 {
					t.Fatalf("--plot %s: exit %d: %s", f, code, errs)
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
			if b := img.Bounds(); b.Dx() < 400 || b.Dy() < 250 || st.Size() < 10_000 {
				t.Errorf("PNG is %dx%d, %d bytes; too small to hold the curves", b.Dx(), b.Dy(), st.Size())
			}
			svg, err := os.ReadFile(svgFile)
			if err != nil {
				t.Fatal(err)
			}
			s := string(svg)
			if !strings.Contains(s, "<svg") || len(s) < 4_000 {
				t.Fatalf("%s is not a plausible SVG (%d bytes)", svgFile, len(s))
			}
			for _, l := range tc.legend {
				if !strings.Contains(s, svgEscape(l)) {
					t.Errorf("SVG lacks the text %q (legend, title or axis label)", l)
				}
			}
		})
	}
}

// svgEscape matches how text lands in the SVG.
func svgEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
