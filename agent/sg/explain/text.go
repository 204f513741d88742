package explain

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/reft-hpc/reft/agent/sg"
	"github.com/reft-hpc/reft/pmix/hostlist"
	"github.com/reft-hpc/reft/spank/spec"
)

func writeText(w io.Writer, r *report) {
	for _, section := range []func(io.Writer, *report){
		writeHeader, writeProtection, writeGroups, writePlacement, writeWarnings, writeFailures, writeDomainFailures,
	} {
		section(w, r)
	}
}

// writeHeader writes the first lines: the SPEC, the layout, the ranks per node, the spare nodes.
func writeHeader(w io.Writer, r *report) {
	perNode := map[int]int{}
	for _, k := range r.RanksPerNode {
		perNode[k]++
	}
	var per string
	if len(perNode) == 1 {
		for k := range perNode {
			per = fmt.Sprintf(", %d per node", k)
		}
	}
	fmt.Fprintf(w, "reft explain: --reft=%s, dp=%d pp=%d tp=%d (order %s), %d ranks on %d nodes%s\n",
		r.Spec, r.Layout.DP, r.Layout.PP, r.Layout.TP, r.Layout.Order, r.Layout.World, len(r.RanksPerNode), per)
	if len(r.Spares) > 0 {
		fmt.Fprintf(w, "spare nodes (no ranks, their failure changes nothing): %s\n", hostlist.Compress(r.Spares))
	}
}

// writeProtection writes how each kind of buffer is protected.
func writeProtection(w io.Writer, r *report) {
	fmt.Fprintf(w, "\nProtection (buffers: %s)\n", r.Buffers)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, p := range r.Protection {
		modes := p.Modes
		if modes == "" {
			modes = "-"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", p.Kind, modes, p.Text)
	}
	tw.Flush()
}

// writeGroups writes the sharding groups (at most textGroups) and who keeps whose copies.
func writeGroups(w io.Writer, r *report) {
	if r.Buffers&(sg.Replicated|sg.Optimizer) != 0 && len(r.Groups) > 0 {
		keeps := "ring order"
		switch sp, _ := spec.Parse(r.Spec); {
		case sp.ARC && sp.AOR:
			keeps = "ring order: each member keeps the next one's ARC copy and AOR replica"
		case sp.ARC:
			keeps = "ring order: each member keeps the next one's ARC copy"
		case sp.AOR:
			keeps = "ring order: each member keeps the next one's AOR replica"
		}
		fmt.Fprintf(w, "\nSharding groups (%d; %s)\n", len(r.Groups), keeps)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		withDomains := len(r.Domains) > 0
		for i, g := range r.Groups {
			if i == textGroups {
				fmt.Fprintf(tw, "  ... %d more (--json lists all)\n", len(r.Groups)-i)
				break
			}
			var ranks, nodes, doms []string
			for _, m := range g.Members {
				ranks = append(ranks, strconv.Itoa(m.Rank))
				nodes = append(nodes, m.Node)
				doms = append(doms, m.Domain)
			}
			line := fmt.Sprintf("  %s\tranks %s\tnodes %s", g, strings.Join(ranks, ","), strings.Join(nodes, ","))
			if withDomains {
				line += "\tdomains " + strings.Join(doms, ",")
			}
			fmt.Fprintln(tw, line)
		}
		tw.Flush()
	}
}

// writePlacement writes where GEMINI placement puts each node's per-rank state (at most textHolders).
func writePlacement(w io.Writer, r *report) {
	if pl := r.Placement; pl.Replicas > 1 {
		var parts []string
		for _, g := range pl.Groups {
			parts = append(parts, "{"+hostlist.Compress(g)+"}")
		}
		desc := "groups " + strings.Join(parts, " ")
		if len(pl.Groups) == 0 {
			desc = "no groups"
		}
		if len(pl.Ring) > 0 {
			desc += ", ring " + strings.Join(pl.Ring, "->") + "->"
		}
		fmt.Fprintf(w, "\nPlacement of per-rank state (GEMINI %s, %d replicas): %s\n", pl.Strategy, pl.Replicas, desc)
		names := make([]string, 0, len(pl.Holders))
		for n := range pl.Holders {
			names = append(names, n)
		}
		order := map[string]int{}
		for i, n := range r.Nodes {
			order[n] = i
		}
		sort.Slice(names, func(i, j int) bool { return order[names[i]] < order[names[j]] })
		for i, n := range names {
			if i == textHolders {
				fmt.Fprintf(w, "  ... %d more (--json lists all)\n", len(names)-i)
				break
			}
			fmt.Fprintf(w, "  %s -> copies on %s\n", n, strings.Join(pl.Holders[n], ","))
		}
	}
}

// writeWarnings writes the warnings (at most textWarnings).
func writeWarnings(w io.Writer, r *report) {
	fmt.Fprintf(w, "\nWarnings\n")
	if len(r.Warnings) == 0 {
		fmt.Fprintf(w, "  none\n")
	}
	for i, x := range r.Warnings {
		if i == textWarnings {
			fmt.Fprintf(w, "  ... %d more (--json lists all)\n", len(r.Warnings)-i)
			break
		}
		fmt.Fprintf(w, "  %s\n", x.Msg)
	}
}

// writeFailures writes the node failure sets checked, and those not survived.
func writeFailures(w io.Writer, r *report) {
	fmt.Fprintf(w, "\nFailures (a set of failed nodes is survived when every shard keeps an in-memory source)\n")
	if r.Tolerance > 0 {
		fmt.Fprintf(w, "  guaranteed by the layout: any %s\n", nodesWord(r.Tolerance))
	} else {
		fmt.Fprintf(w, "  guaranteed by the layout: none (a single node failure can lose state; see below)\n")
	}
	for _, f := range r.Failures {
		line := fmt.Sprintf("  %s: %d of %d sets survive", nodesWord(f.Nodes), f.Survived, f.Checked)
		if !f.Exact {
			line = fmt.Sprintf("  %s: %d of %d sampled sets survive (%s sets in all)", nodesWord(f.Nodes), f.Survived, f.Checked, f.Sets)
		}
		fails := f.Checked - f.Survived
		if fails == 0 {
			fmt.Fprintln(w, line)
			continue
		}
		fmt.Fprintf(w, "%s; %d do not:\n", line, fails)
		shown := f.Failing[:min(textFailing, len(f.Failing))]
		for _, s := range shown {
			writeReasons(w, strings.Join(s.Nodes, ","), s.Reasons)
		}
		if fails > len(shown) {
			fmt.Fprintf(w, "    ... %d more (--json lists up to %d)\n", fails-len(shown), jsonFailing)
		}
	}
}

// writeDomainFailures writes what a whole failure domain's loss does.
func writeDomainFailures(w io.Writer, r *report) {
	if len(r.Domains) > 0 {
		fmt.Fprintf(w, "\nDomain failures (every node of one domain at once)\n")
		for _, d := range r.Domains {
			label := fmt.Sprintf("%s (%s)", d.Domain, hostlist.Compress(d.Nodes))
			if d.Survives {
				fmt.Fprintf(w, "    %s: survives\n", label)
				continue
			}
			writeReasons(w, label, d.Reasons)
		}
	}
}

// writeReasons prints "    what: first reason" and the rest indented.
func writeReasons(w io.Writer, what string, reasons []string) {
	if len(reasons) == 0 {
		fmt.Fprintf(w, "    %s: lost\n", what)
		return
	}
	fmt.Fprintf(w, "    %s: %s\n", what, reasons[0])
	for i, x := range reasons[1:] {
		if i == textAlso {
			fmt.Fprintf(w, "      and %d more reasons (--json lists them)\n", len(reasons)-1-i)
			break
		}
		fmt.Fprintf(w, "      also %s\n", x)
	}
}

func nodesWord(n int) string {
	if n == 1 {
		return "1 failed node"
	}
	return fmt.Sprintf("%d failed nodes", n)
}
