package hostmem

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func fakeProc(t *testing.T, totalKiB, availKiB int64) string {
	t.Helper()
	dir := t.TempDir()
	mi := fmt.Sprintf("MemTotal:       %d kB\nMemFree:        %d kB\nMemAvailable:   %d kB\n", totalKiB, availKiB, availKiB)
	if err := os.WriteFile(filepath.Join(dir, "meminfo"), []byte(mi), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestParseCap(t *testing.T) {
	tests := []struct {
		in   string
		want Cap
		bad  bool
	}{
		{in: "0.5", want: Cap{Fraction: 0.5}},
		{in: "25%", want: Cap{Fraction: 0.25}},
		{in: "8GiB", want: Cap{Bytes: 8 << 30}},
		{in: "512M", want: Cap{Bytes: 512 << 20}},
		{in: "1.5G", want: Cap{Bytes: 3 << 29}},
		{in: "4096", want: Cap{Bytes: 4096}},
		{in: "0", bad: true},
		{in: "1.5", bad: true},
		{in: "150%", bad: true},
		{in: "8 parsecs", bad: true},
	}
	for _, tc := range tests {
		got, err := ParseCap(tc.in)
		if tc.bad != (err != nil) || got != tc.want {
			t.Errorf("ParseCap(%q) = %+v, %v; want %+v, error %v", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	tests := map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1 KiB", 3 << 29: "1.5 GiB", 4 << 30: "4 GiB"}
	for n, want := range tests {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestBudget(t *testing.T) {
	const gib = 1 << 30
	tests := []struct {
		name        string
		cap         Cap
		totalKiB    int64
		availKiB    int64
		reserve     []int64
		wantErrAt   int    // index of the first refused Reserve, -1 for none
		wantInError string // in the refusal's message
	}{
		{"fraction fits", Cap{Fraction: 0.5}, 16 << 20, 15 << 20, []int64{4 * gib, 4 * gib}, -1, ""},
		{"fraction exceeded", Cap{Fraction: 0.5}, 16 << 20, 15 << 20, []int64{4 * gib, 4 * gib, 1}, 2, "1 B asked exceeds the memory budget of 8 GiB"},
		{"bytes exceeded", Cap{Bytes: 3 * gib}, 16 << 20, 15 << 20, []int64{2 * gib, 2 * gib}, 1, "2 GiB in use + 2 GiB asked"},
		{"node nearly out of memory", Cap{Fraction: 1}, 16 << 20, 3 << 20, []int64{gib, 11 * gib / 4}, 1, "only 3 GiB of the node's memory is available"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := new(Metrics)
			b, err := NewBudget(BudgetConfig{Cap: tc.cap, Headroom: 512 << 20, ProcFS: fakeProc(t, tc.totalKiB, tc.availKiB)}, m)
			if err != nil {
				t.Fatal(err)
			}
			var used int64
			for i, n := range tc.reserve {
				err := b.Reserve(n)
				if i == tc.wantErrAt {
					var be *BudgetError
					if !errors.As(err, &be) || !errors.Is(err, ErrOverBudget) {
						t.Fatalf("Reserve #%d = %v, want a *BudgetError", i, err)
					}
					if be.Asked != n || be.InUse != used || be.Limit != b.Limit() {
						t.Fatalf("BudgetError %+v: want asked %d, in use %d, limit %d", be, n, used, b.Limit())
					}
					if !strings.Contains(err.Error(), tc.wantInError) {
						t.Fatalf("message %q lacks %q", err, tc.wantInError)
					}
					if m.BudgetRefusals.Load() != 1 || b.InUse() != used {
						t.Fatalf("refusal counted %d, in use %d after refusal (want 1, %d)", m.BudgetRefusals.Load(), b.InUse(), used)
					}
					return
				}
				if err != nil {
					t.Fatalf("Reserve #%d: %v", i, err)
				}
				used += n
			}
			if tc.wantErrAt >= 0 {
				t.Fatal("no refusal")
			}
			b.Release(used)
			if b.InUse() != 0 || m.BudgetInUseBytes.Load() != 0 {
				t.Fatalf("after release: in use %d", b.InUse())
			}
		})
	}
}

func TestBudgetRealMeminfo(t *testing.T) {
	b, err := NewBudget(BudgetConfig{Cap: Cap{Fraction: 0.25}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b.Limit() <= 0 {
		t.Fatalf("limit %d from /proc/meminfo", b.Limit())
	}
	if err := b.Reserve(b.Limit() + 1); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("reserving more than the limit: %v", err)
	}
}
