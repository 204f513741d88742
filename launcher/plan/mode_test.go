package plan

import (
	"strings"
	"testing"
)

func TestParseMode(t *testing.T) {
	tests := []struct {
		spec string
		tol  int
		err  string
	}{
		{"arc", 1, ""},
		{"aec", 1, ""},
		{"aec:3", 3, ""},
		{"arc:2", 2, ""},
		{"arc+aec", 2, ""},
		{"ARC+aec:2", 3, ""},
		{"aor", 1, ""},
		{"off", 0, ""},
		{"", 0, "--mode is empty"},
		{"raid", 0, "unknown scheme"},
		{"aec:0", 0, "whole number >= 1"},
		{"aec:x", 0, "whole number >= 1"},
		{"aor:2", 0, "aor takes no count"},
		{"off+arc", 0, "off cannot be combined"},
	}
	for _, tc := range tests {
		m, err := ParseMode(tc.spec)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseMode(%q) error = %v, want one containing %q", tc.spec, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseMode(%q): %v", tc.spec, err)
			continue
		}
		if got := m.Tolerance(); got != tc.tol {
			t.Errorf("ParseMode(%q).Tolerance() = %d, want %d", tc.spec, got, tc.tol)
		}
	}
}

func TestCheckTolerance(t *testing.T) {
	m, _ := ParseMode("arc+aec")
	if err := m.checkTolerance(2); err == nil || !strings.Contains(err.Error(), "at most n-1") {
		t.Errorf("arc+aec on an SG of 2: error = %v, want the n-1 rule", err)
	}
	if err := m.checkTolerance(3); err != nil {
		t.Errorf("arc+aec on an SG of 3: %v", err)
	}
}
