// Package hostlist expands and compresses Slurm host lists ("n[1-3,7],gpu01").
//
// It is pure Go with no cgo, so packages that must stay cgo-free (agent/sg,
// the CLI) can parse node lists without importing package pmix, whose PMIx
// binding is cgo. The syntax: items
// separated by commas outside brackets, at most one bracket group per item,
// ranges "lo-hi" or single numbers, zero padding taken from lo.
package hostlist

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxRange bounds one bracket range, so a typing slip ("n[1-9999999]")
// fails instead of allocating millions of names; MaxHosts bounds the whole
// list, which many ranges ("n[0-999999,0-999999,...]") would otherwise
// grow without limit (found by FuzzExpand).
const (
	MaxRange = 1 << 20
	MaxHosts = 1 << 20
)

// Expand expands a Slurm host list into its hosts, in order. Zero padding in
// ranges is kept ("n[01-03]" gives n01, n02, n03).
func Expand(list string) ([]string, error) {
	if strings.TrimSpace(list) == "" {
		return nil, fmt.Errorf("empty host list")
	}
	var hosts []string
	for _, item := range SplitTop(list) {
		item = strings.TrimSpace(item)
		open := strings.IndexByte(item, '[')
		if open < 0 {
			if item == "" || strings.ContainsAny(item, "]") {
				return nil, fmt.Errorf("bad host %q in %q", item, list)
			}
			if len(hosts) >= MaxHosts {
				return nil, fmt.Errorf("host list %.64q... has more than %d hosts", list, MaxHosts)
			}
			hosts = append(hosts, item)
			continue
		}
		close := strings.IndexByte(item, ']')
		if close < open {
			return nil, fmt.Errorf("unbalanced brackets in %q", item)
		}
		prefix, ranges, suffix := item[:open], item[open+1:close], item[close+1:]
		if strings.ContainsAny(suffix, "[]") {
			return nil, fmt.Errorf("more than one bracket group in %q is not supported", item)
		}
		for _, r := range strings.Split(ranges, ",") {
			lo, hi, found := strings.Cut(r, "-")
			if !found {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil || a > b || a < 0 || !digits(lo) || !digits(hi) {
				return nil, fmt.Errorf("bad range %q in %q (want lo-hi, lo <= hi, as in n[1-4])", r, item)
			}
			if b-a >= MaxRange {
				return nil, fmt.Errorf("range %q in %q is too large (at most %d hosts)", r, item, MaxRange)
			}
			if b-a >= MaxHosts-len(hosts) {
				return nil, fmt.Errorf("host list %.64q... has more than %d hosts", list, MaxHosts)
			}
			width := len(lo)
			for n := a; n <= b; n++ {
				hosts = append(hosts, fmt.Sprintf("%s%0*d%s", prefix, width, n, suffix))
			}
		}
	}
	return hosts, nil
}

func digits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// SplitTop splits s on commas outside brackets.
func SplitTop(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}

// Compress writes hosts as a host list, merging neighbours that differ only
// in a trailing number: n1,n2,n3,n7,gpu01 -> n[1-3,7],gpu01. Order is kept,
// so Expand(Compress(h)) == h for every list of valid host names; where a
// merge could not round-trip (odd padding), the names are listed plainly.
func Compress(hosts []string) string {
	var b strings.Builder
	for i := 0; i < len(hosts); {
		prefix, _, ok := splitNum(hosts[i])
		j := i + 1
		if ok {
			for j < len(hosts) {
				p, _, ok2 := splitNum(hosts[j])
				if !ok2 || p != prefix {
					break
				}
				j++
			}
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j-i == 1 {
			b.WriteString(hosts[i])
			i = j
			continue
		}
		b.WriteString(prefix)
		b.WriteByte('[')
		first := true
		for k := i; k < j; {
			_, lo, _ := splitNum(hosts[k])
			n, _ := strconv.Atoi(lo)
			end := k
			for end+1 < j {
				_, next, _ := splitNum(hosts[end+1])
				if next != fmt.Sprintf("%0*d", len(lo), n+end+1-k) {
					break
				}
				end++
			}
			if !first {
				b.WriteByte(',')
			}
			first = false
			b.WriteString(lo)
			if end > k {
				_, hi, _ := splitNum(hosts[end])
				b.WriteString("-" + hi)
			}
			k = end + 1
		}
		b.WriteByte(']')
		i = j
	}
	out := b.String()
	if back, err := Expand(out); err != nil || !equal(back, hosts) {
		return strings.Join(hosts, ",")
	}
	return out
}

// splitNum splits "gpu017" into "gpu" and "017"; ok is false without a
// trailing number or with characters Expand would misread.
func splitNum(h string) (prefix, num string, ok bool) {
	if strings.ContainsAny(h, "[],") {
		return "", "", false
	}
	i := len(h)
	for i > 0 && h[i-1] >= '0' && h[i-1] <= '9' {
		i--
	}
	if i == len(h) || len(h)-i > 9 {
		return "", "", false
	}
	return h[:i], h[i:], true
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
