package status

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/reft-hpc/reft/agent/proto"
)

// up is a node whose agent answered with one rank at step newest.
func up(node string, rank int, newest int64) NodeReport {
	return NodeReport{Node: node, Agent: AgentUp, InAllocation: true, Status: &proto.Status{Node: node, Spec: "arc",
		Ranks:   []proto.RankStatus{{Rank: rank, Newest: newest, Protection: &proto.RankProtection{Connected: true, Mode: proto.ProtectSharded, ARC: true, Group: "(pp=0,tp=0)", Members: []int{0, 1}, Position: rank}}},
		Peering: &proto.Peering{State: proto.PeeringOn}}}
}

func down(node, why string) NodeReport {
	return NodeReport{Node: node, Agent: AgentDown, InAllocation: true, SlurmState: "DOWN*", Error: why, Warnings: []string{"Slurm says the node is DOWN*"}}
}

func report(nodes ...NodeReport) *Report {
	return &Report{Job: "42", State: "RUNNING", User: "alice", Spec: "arc", Nodes: nodes}
}

// answer is one scripted reply of the fake Query.
type answer struct {
	rep *Report
	err error
}

var (
	errSlurmSlow = errors.New("scontrol show job -o 42: signal: killed (is Slurm's client installed and slurmctld up?)")
	errEnded     = notRunning{"job 42 is COMPLETED, not running: its agents live only while it runs (reft log 42 tells what happened)"}
)

// TestWatch runs Watch on a fake clock (testing/synctest) over a scripted
// sequence of query answers: what each refresh prints, plain and on a
// terminal, when the committed step moves, an agent goes away and comes
// back, a query fails for a while, the job ends or belongs to another
// user, and that refreshes come one interval apart.
func TestWatch(t *testing.T) {
	ts := `\d\d:\d\d:\d\d `
	for _, tc := range []struct {
		name    string
		tty     bool
		answers []answer
		wantErr error
		// want are regexps that must match, in this order, lines of the
		// output (each after the previous match); never must match none.
		want  []string
		never []string
		// once are substrings that must occur exactly once.
		once []string
	}{
		{
			name: "committed step moves, an agent goes away and comes back",
			answers: []answer{
				{rep: report(up("n1", 0, 5), up("n2", 1, 5))},
				{rep: report(up("n1", 0, 6), down("n2", "no agent of this job answers on its ports (127.0.0.1 port 47001: connection refused)"))},
				{rep: report(up("n1", 0, 7), down("n2", "no agent of this job answers on its ports (127.0.0.1 port 47001: connection refused)"))},
				{rep: report(up("n1", 0, 9), up("n2", 1, 8))},
				{err: errEnded},
			},
			want: []string{
				`^` + ts + `n1 agent up committed 5 peers 0/0$`,
				`^` + ts + `n2 agent up committed 5 peers 0/0$`,
				`^` + ts + `n2: its agent went away \(agent down; it had committed step 5\): no agent of this job answers on its ports \(127\.0\.0\.1 port 47001: connection refused\)$`,
				`^` + ts + `n1 agent up committed 6 `,
				`^` + ts + `n2 agent down committed - peers - degraded: no agent of this job answers .*; Slurm says the node is DOWN\*$`,
				`^` + ts + `n1 agent up committed 7 `,
				`^` + ts + `n2: its agent is up again \(committed step 8\)$`,
				`^` + ts + `n2 agent up committed 8 `,
				`^` + ts + `the job no longer runs: job 42 is COMPLETED, not running: .*reft log 42`,
			},
			once: []string{"went away", "up again", "no longer runs"},
		},
		{
			name: "a query fails for a while",
			answers: []answer{
				{rep: report(up("n1", 0, 5))},
				{err: errSlurmSlow},
				{err: errSlurmSlow},
				{rep: report(up("n1", 0, 8))},
				{err: errEnded},
			},
			want: []string{
				`^` + ts + `n1 agent up committed 5 `,
				`^` + ts + `query failed: scontrol show job -o 42: signal: killed .* \(trying again every 2s\)$`,
				`^` + ts + `query answered again$`,
				`^` + ts + `n1 agent up committed 8 `,
			},
			once: []string{"query failed", "answered again"},
		},
		{
			name:    "another user's job ends the watch at once",
			answers: []answer{{err: fmt.Errorf("%w: job 42 belongs to bob (uid 1002) and you are uid 1001", ErrForeign)}},
			wantErr: ErrForeign,
			never:   []string{`agent`},
		},
		{
			name: "a spare's agent comes up after a relaunch",
			answers: []answer{
				{rep: report(up("n1", 0, 5), NodeReport{Node: "n5", Agent: AgentNone, InAllocation: true, Error: "no agent: the node runs no step of this job (a spare, or not used yet)"})},
				{rep: report(up("n1", 0, 6), NodeReport{Node: "n5", Agent: AgentUp, InAllocation: true, Status: &proto.Status{Node: "n5", Spec: "arc"}})},
				{err: errEnded},
			},
			want:  []string{`^` + ts + `n5: its agent is up \(no rank registered yet\)$`},
			never: []string{`up again`},
		},
		{
			name: "a spare is no fault",
			answers: []answer{
				{rep: report(up("n1", 0, 5), NodeReport{Node: "n5", Agent: AgentNone, InAllocation: true, Error: "no agent: the node runs no step of this job (a spare, or not used yet)"})},
				{err: errEnded},
			},
			want:  []string{`^` + ts + `n5 agent none committed - peers - \(no agent: the node runs no step of this job`},
			never: []string{`degraded`},
		},
		{
			name: "terminal: redrawn in place, changes under the table",
			tty:  true,
			answers: []answer{
				{rep: report(up("n1", 0, 5), up("n2", 1, 5))},
				{rep: report(up("n1", 0, 6), down("n2", "no agent of this job answers on its ports"))},
				{err: errSlurmSlow},
				{err: errEnded},
			},
			want: []string{
				`^\x1b\[H\x1b\[2Jreft status --watch, every 2s, at ` + ts + `\(Ctrl-C to stop\)$`,
				`^job 42 \(alice\) RUNNING, --reft=arc, 2 nodes$`,
				`^n1 +up +0 +5 `,
				`^\x1b\[H\x1b\[2Jreft status --watch`,
				`^n1 +up +0 +6 `,
				`^n2 +down +- +- `,
				`^changes:$`,
				`^  ` + ts + `n2: its agent went away \(agent down; it had committed step 5\)`,
				`^\x1b\[H\x1b\[2Jreft status --watch`,
				`^QUERY FAILING: scontrol show job -o 42`,
				`^n1 +up +0 +6 `, // the last report stays on screen
				`^  ` + ts + `query failed: `,
				`^` + ts + `the job no longer runs: job 42 is COMPLETED`,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var out bytes.Buffer
				var at []time.Time
				calls := 0
				query := func(ctx context.Context) (*Report, error) {
					at = append(at, time.Now())
					a := tc.answers[min(calls, len(tc.answers)-1)]
					calls++
					return a.rep, a.err
				}
				err := Watch(t.Context(), &out, WatchOptions{Query: query, TTY: tc.tty})
				if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
					t.Fatalf("Watch returned %v, want %v", err, tc.wantErr)
				}
				if calls != len(tc.answers) {
					t.Errorf("%d queries, want %d (one per answer, none after the watch ended)", calls, len(tc.answers))
				}
				for i := 1; i < len(at); i++ {
					if d := at[i].Sub(at[i-1]); d != 2*time.Second {
						t.Errorf("query %d came %v after the one before, want the default interval 2s", i+1, d)
					}
				}
				lines := strings.Split(out.String(), "\n")
				i := 0
				for _, w := range tc.want {
					re := regexp.MustCompile(w)
					for i < len(lines) && !re.MatchString(lines[i]) {
						i++
					}
					if i == len(lines) {
						t.Fatalf("no line matching %q (in order) in:\n%s", w, out.String())
					}
					i++
				}
				for _, n := range tc.never {
					if regexp.MustCompile(n).MatchString(out.String()) {
						t.Errorf("output matches %q:\n%s", n, out.String())
					}
				}
				for _, o := range tc.once {
					if c := strings.Count(out.String(), o); c != 1 {
						t.Errorf("%q said %d times, want once:\n%s", o, c, out.String())
					}
				}
			})
		})
	}
}

// TestWatchInterrupted: Ctrl-C (the context cancelled) ends the watch with
// no error, at the interval asked for, in the middle of a wait or of a
// query.
func TestWatchInterrupted(t *testing.T) {
	for _, tc := range []struct {
		name     string
		interval time.Duration
		stopAt   time.Duration
		slow     time.Duration // each query's own time
		want     int           // queries
	}{
		{"between refreshes", 500 * time.Millisecond, 1300 * time.Millisecond, 0, 3},
		{"during a slow query", time.Second, 2500 * time.Millisecond, 800 * time.Millisecond, 3},
		{"queries slower than the interval", time.Second, 4 * time.Second, 1400 * time.Millisecond, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(t.Context(), tc.stopAt)
				defer cancel()
				calls := 0
				var out bytes.Buffer
				err := Watch(ctx, &out, WatchOptions{Interval: tc.interval, Query: func(ctx context.Context) (*Report, error) {
					calls++
					select {
					case <-time.After(tc.slow):
						return report(up("n1", 0, int64(calls))), nil
					case <-ctx.Done():
						return nil, ctx.Err()
					}
				}})
				if err != nil {
					t.Fatalf("Watch interrupted returned %v, want nil", err)
				}
				if calls != tc.want {
					t.Errorf("%d queries before the interrupt, want %d:\n%s", calls, tc.want, out.String())
				}
				if strings.Contains(out.String(), "query failed") {
					t.Errorf("the interrupted query was reported as a failure:\n%s", out.String())
				}
			})
		})
	}
}

// TestWatchFlags: --watch refuses what it cannot show, before asking
// anyone, with the reason.
func TestWatchFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--watch", "--json", "42"}, "--watch shows the table"},
		{[]string{"--watch", "--prom", "42"}, "--watch shows the table"},
		{[]string{"--watch", "--interval", "10ms", "42"}, "--interval 10ms is too short"},
	} {
		var stdout, stderr bytes.Buffer
		if code := Command(tc.args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) || stdout.Len() > 0 {
			t.Errorf("reft status %v: exit %d, stderr %q, stdout %q; want exit 2 naming %q", tc.args, code, stderr.String(), stdout.String(), tc.want)
		}
	}
}
