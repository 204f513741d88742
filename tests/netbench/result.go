// Package netbench is the record of one network-fault run (issue 18) that
// the e2e scenarios log and `make bench-net` gathers into the table of
// docs/BENCHMARKS.md: verdicts expected and seen over N repetitions, false
// positives and negatives, detection time for the real losses.
package netbench

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// Marker starts a result in a test's log line; the JSON of a Result follows.
const Marker = "net-result: "

// Result is one run of one scenario.
type Result struct {
	Scenario string   `json:"scenario"`
	Expected []string `json:"expected"` // nodes a verdict is expected about (none: no verdict)
	Seen     []string `json:"seen"`     // nodes the agents' verdicts were about, one per verdict
	// DetectS is seconds from the fault to the first verdict (-1: none, or
	// no loss to time).
	DetectS float64 `json:"detect_s"`
	Passed  bool    `json:"passed"` // the job's outcome was what the scenario wants
}

// Parse finds every result line in r (go test -v output).
func Parse(r io.Reader) ([]Result, error) {
	var out []Result
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		_, js, ok := strings.Cut(sc.Text(), Marker)
		if !ok {
			continue
		}
		var res Result
		if err := json.Unmarshal([]byte(js), &res); err != nil {
			return nil, fmt.Errorf("line %d: a %q line that is not a result's JSON: %w (was the log cut?)", n, strings.TrimSpace(Marker), err)
		}
		if res.Scenario == "" {
			return nil, fmt.Errorf("line %d: a result without a scenario", n)
		}
		out = append(out, res)
	}
	return out, sc.Err()
}

// Row is one scenario's repetitions.
type Row struct {
	Scenario       string
	N, Passed      int
	Expected, Seen int // verdicts over all runs
	FalsePos       int // verdicts about a node none was expected about
	FalseNeg       int // expected verdicts not seen
	Detect         []float64
}

// Rows groups results by scenario, in the order first seen.
func Rows(rs []Result) []Row {
	var rows []Row
	for _, r := range rs {
		i := slices.IndexFunc(rows, func(x Row) bool { return x.Scenario == r.Scenario })
		if i < 0 {
			rows = append(rows, Row{Scenario: r.Scenario})
			i = len(rows) - 1
		}
		row := &rows[i]
		row.N++
		if r.Passed {
			row.Passed++
		}
		row.Expected += len(r.Expected)
		row.Seen += len(r.Seen)
		for _, s := range r.Seen {
			if !slices.Contains(r.Expected, s) {
				row.FalsePos++
			}
		}
		for _, e := range r.Expected {
			if !slices.Contains(r.Seen, e) {
				row.FalseNeg++
			}
		}
		if r.DetectS >= 0 {
			row.Detect = append(row.Detect, r.DetectS)
		}
	}
	return rows
}

// Table prints rows as the Markdown table of docs/BENCHMARKS.md.
func Table(w io.Writer, rows []Row) {
	fmt.Fprintln(w, "| scenario | N | passed | verdicts expected | seen | false positives | false negatives | detection s (min / median / max) |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range rows {
		det := "-"
		if len(r.Detect) > 0 {
			d := slices.Clone(r.Detect)
			slices.SortFunc(d, cmp.Compare)
			det = fmt.Sprintf("%.2f / %.2f / %.2f", d[0], median(d), d[len(d)-1])
		}
		fmt.Fprintf(w, "| %s | %d | %d | %d | %d | %d | %d | %s |\n", r.Scenario, r.N, r.Passed, r.Expected, r.Seen, r.FalsePos, r.FalseNeg, det)
	}
}

func median(sorted []float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}
