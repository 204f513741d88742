package hostlist

import (
	"slices"
	"strings"
	"testing"
)

// FuzzExpand: Expand (host lists come from Slurm's environment and from
// scontrol/squeue output) never panics, never yields more than MaxHosts
// names or an empty one, and Compress of what it yields expands back to
// the same hosts.
func FuzzExpand(f *testing.F) {
	for _, s := range []string{"n1", "n[1-3,7],gpu01", "n[01-03]", "a[0-9]b", "x[1-1048576]", "n[0-1048575],m",
		"n[1-2,3-4]x,y[5]", "[1-2]", "n[2-1]", "n[-1]", "n[1-", "a],b", " n[1] , m ", "n[1-2][3]", "n[007-011]",
		"n[0-524287,0-524287,0-1]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		hosts, err := Expand(in)
		if err != nil {
			if hosts != nil {
				t.Fatalf("Expand(%q) returned hosts with error %v", in, err)
			}
			return
		}
		if len(hosts) == 0 || len(hosts) > MaxHosts {
			t.Fatalf("Expand(%q) gave %d hosts", in, len(hosts))
		}
		for _, h := range hosts {
			if h == "" || strings.ContainsAny(h, ",[") {
				t.Fatalf("Expand(%q) gave host %q", in, h)
			}
		}
		c := Compress(hosts)
		back, err := Expand(c)
		if err != nil || !slices.Equal(back, hosts) {
			t.Fatalf("Expand(Compress(Expand(%q))) via %q: %v, %d hosts, want %d", in, c, err, len(back), len(hosts))
		}
	})
}

// TestExpandBoundsTotal: many ranges, each within MaxRange, used to expand
// to any number of hosts (a 1 KiB list gave a hundred million names).
func TestExpandBoundsTotal(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int // hosts; -1: an error
	}{
		{"n[0-524287,0-524287]", MaxHosts},
		{"n[0-524287,0-524287,0]", -1},
		{"n[0-1048575],m", -1},
		{"n[0-" + "999999" + strings.Repeat(",0-999999", 99) + "]", -1},
	} {
		hosts, err := Expand(tc.in)
		if tc.want < 0 && err == nil || tc.want >= 0 && (err != nil || len(hosts) != tc.want) {
			t.Errorf("Expand(%.40q): %d hosts, %v; want %d", tc.in, len(hosts), err, tc.want)
		}
	}
}

// FuzzExpandCounts: ExpandCounts (per-node counts from Slurm's
// environment) never panics, never yields more than MaxHosts counts or a
// negative one, and CompressCounts of what it yields expands back to it.
func FuzzExpandCounts(f *testing.F) {
	for _, s := range []string{"1", "2(x5)", "8,4(x2),2", "0(x3),1", "2(x0)", "2(x", "(x2)", "-1", "1(x1048576),1(x1048576)", ",", "3(x2)x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		c, err := ExpandCounts(in)
		if err != nil {
			if c != nil {
				t.Fatalf("ExpandCounts(%q) returned counts with error %v", in, err)
			}
			return
		}
		if len(c) == 0 || len(c) > MaxHosts || slices.ContainsFunc(c, func(n int) bool { return n < 0 }) {
			t.Fatalf("ExpandCounts(%q) gave %d counts: %.20v", in, len(c), c)
		}
		back, err := ExpandCounts(CompressCounts(c))
		if err != nil || !slices.Equal(back, c) {
			t.Fatalf("ExpandCounts(CompressCounts(ExpandCounts(%q))): %v", in, err)
		}
	})
}
