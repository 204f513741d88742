package client

import (
	"strings"
	"testing"
)

// TestDegradedNotice: said when the reasons appear or change, once;
// "protected again" once when they are gone; nothing while unchanged.
func TestDegradedNotice(t *testing.T) {
	var d degradedNotice
	for i, tc := range []struct {
		why  []string
		want string // a substring of what is said; "" nothing
	}{
		{nil, ""},
		{[]string{"peering"}, "less protected than the SPEC asks (peering)"},
		{[]string{"peering"}, ""},
		{[]string{"peering", "rank_local"}, "less protected than the SPEC asks (peering, rank_local)"},
		{nil, "protected as the SPEC asks again (it had said: peering, rank_local)"},
		{nil, ""},
	} {
		got := d.note(tc.why)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("commit %d with %q: said %q, want %q", i, tc.why, got, tc.want)
		}
	}
}
