package netbench

import (
	"strings"
	"testing"
)

// TestRows: verdicts about the expected node count as seen; one about
// another node is a false positive, an expected one missing a false
// negative; detection times only where there was a loss to time.
func TestRows(t *testing.T) {
	log := `=== RUN   TestNetFaultsNoVerdict
    netfault_test.go:70: net-result: {"scenario":"flap","expected":[],"seen":[],"detect_s":-1,"passed":true}
    netfault_test.go:70: net-result: {"scenario":"flap","expected":[],"seen":["n1"],"detect_s":-1,"passed":false}
    netfault_test.go:90: net-result: {"scenario":"loss","expected":["n2"],"seen":["n2"],"detect_s":4.5,"passed":true}
    netfault_test.go:90: net-result: {"scenario":"loss","expected":["n2"],"seen":[],"detect_s":-1,"passed":false}
    netfault_test.go:90: net-result: {"scenario":"loss","expected":["n2"],"seen":["n2"],"detect_s":5.5,"passed":true}
--- PASS`
	rs, err := Parse(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	rows := Rows(rs)
	want := []Row{
		{Scenario: "flap", N: 2, Passed: 1, Expected: 0, Seen: 1, FalsePos: 1},
		{Scenario: "loss", N: 3, Passed: 2, Expected: 3, Seen: 2, FalseNeg: 1, Detect: []float64{4.5, 5.5}},
	}
	if len(rows) != len(want) {
		t.Fatalf("rows %+v, want %+v", rows, want)
	}
	for i := range want {
		g, w := rows[i], want[i]
		if g.Scenario != w.Scenario || g.N != w.N || g.Passed != w.Passed || g.Expected != w.Expected || g.Seen != w.Seen ||
			g.FalsePos != w.FalsePos || g.FalseNeg != w.FalseNeg || len(g.Detect) != len(w.Detect) {
			t.Errorf("row %d: %+v, want %+v", i, g, w)
		}
	}
	var b strings.Builder
	Table(&b, rows)
	if !strings.Contains(b.String(), "| loss | 3 | 2 | 3 | 2 | 0 | 1 | 4.50 / 5.00 / 5.50 |") {
		t.Errorf("table:\n%s", b.String())
	}
}

// TestParseErrors: a cut or foreign result line is an error naming it.
func TestParseErrors(t *testing.T) {
	for _, in := range []string{
		"x: net-result: {\"scenario\":\"fl",
		"net-result: {}",
		"net-result: [1]",
	} {
		if _, err := Parse(strings.NewReader("ok\n" + in + "\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("Parse(%q): %v, want an error naming line 2", in, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add(`net-result: {"scenario":"flap","expected":[],"seen":["n1"],"detect_s":-1,"passed":true}`)
	f.Add("net-result: {")
	f.Fuzz(func(t *testing.T, s string) {
		rs, err := Parse(strings.NewReader(s))
		if err != nil {
			return
		}
		var b strings.Builder
		Table(&b, Rows(rs))
	})
}
