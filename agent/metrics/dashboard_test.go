package metrics

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// panel is what the test reads of a Grafana panel.
type panel struct {
	ID      int     `json:"id"`
	Title   string  `json:"title"`
	Type    string  `json:"type"`
	Panels  []panel `json:"panels"` // a row's
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

var familyRef = regexp.MustCompile(`\breft_[a-z0-9_]+`)

// family is the exported family a series name in a query belongs to.
func familyOf(series string) (string, bool) {
	fams := Families()
	if _, ok := fams[series]; ok {
		return series, true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(series, suf); ok && fams[base] == "histogram" {
			return base, true
		}
	}
	return "", false
}

// grafanaVars are the dashboard's variables as promtool can parse them.
var grafanaVars = strings.NewReplacer("$__rate_interval", "1m", "$__range", "1h", "$job_id", ".*", "$node", ".*")

// TestGrafanaDashboard: etc/grafana/reft.json is valid JSON, every panel
// queries something, every query and variable names exported families
// only, the queries parse as PromQL (promtool check rules on them), and
// the dashboard shows every family but the agent's uptime.
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("../../etc/grafana/reft.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title      string  `json:"title"`
		UID        string  `json:"uid"`
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("etc/grafana/reft.json: %v", err)
	}
	if d.Title == "" || d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("dashboard without title, uid or panels: %q %q %d", d.Title, d.UID, len(d.Panels))
	}
	used := map[string]bool{}
	check := func(where, expr string) {
		refs := familyRef.FindAllString(expr, -1)
		if len(refs) == 0 {
			t.Errorf("%s: query %q names no reft family", where, expr)
		}
		for _, r := range refs {
			f, ok := familyOf(r)
			if !ok {
				t.Errorf("%s: %s is no exported family (agent/metrics.Families)", where, r)
			}
			used[f] = true
		}
	}
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rule
	ids := map[int]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if ids[p.ID] {
				t.Errorf("panel id %d twice", p.ID)
			}
			ids[p.ID] = true
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				where := fmt.Sprintf("panel %q %s", p.Title, tg.RefID)
				check(where, tg.Expr)
				rules = append(rules, rule{Record: fmt.Sprintf("dashboard:panel%d_%s", p.ID, tg.RefID), Expr: grafanaVars.Replace(tg.Expr)})
			}
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			check("variable "+v.Name, fmt.Sprint(q["query"]))
		}
	}
	for name := range Families() {
		if !used[name] && name != "reft_agent_uptime_seconds" {
			t.Errorf("the dashboard shows nothing of %s", name)
		}
	}
	// promtool parses every query as PromQL: a rules file (JSON is YAML).
	rf, err := json.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(path, rf, 0o644); err != nil {
		t.Fatal(err)
	}
	pt, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: make deps installs Debian's prometheus package, which has it")
	}
	if out, err := exec.Command(pt, "check", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules on the dashboard's queries: %v\n%s", err, out)
	}
}
