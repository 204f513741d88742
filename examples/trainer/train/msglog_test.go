package train

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestMemLog(t *testing.T) {
	msg := []float32{1, -2, float32(math.NaN()), 0.5}
	for _, tc := range []struct {
		name string
		do   func(l *MemLog) error
		want string // "" : no error
	}{
		{"read back", func(l *MemLog) error {
			dst := make([]float32, 4)
			if err := l.Read("act>1", 3, 0, dst); err != nil {
				return err
			}
			if !same(dst, msg) {
				return fmt.Errorf("read %v, logged %v", dst, msg)
			}
			return nil
		}, ""},
		{"re-append same bits (NaN too)", func(l *MemLog) error { return l.Append("act>1", 3, 0, msg) }, ""},
		{"re-append other bits", func(l *MemLog) error { return l.Append("act>1", 3, 0, []float32{1, -2, 0, 0.5}) }, "logged with other contents"},
		{"re-append other length", func(l *MemLog) error { return l.Append("act>1", 3, 0, msg[:3]) }, "logged with other contents"},
		{"missing", func(l *MemLog) error { return l.Read("act>1", 2, 0, make([]float32, 4)) }, "act>1 step 2 seq 0 is not held (the log holds steps 3..3 of act>1)"},
		{"other stream", func(l *MemLog) error { return l.Read("grad>0", 3, 0, make([]float32, 4)) }, "holds no step of grad>0"},
		{"wrong length", func(l *MemLog) error { return l.Read("act>1", 3, 0, make([]float32, 5)) }, "has 4 values, the reader expects 5"},
		{"bad key", func(l *MemLog) error { return l.Append("act>1", 0, 0, msg) }, "step >= 1"},
		{"empty", func(l *MemLog) error { return l.Append("act>1", 4, 0, nil) }, "empty message"},
		{"over the cap", func(l *MemLog) error { return l.Append("act>1", 4, 0, make([]float32, 5)) }, "message log full: it holds 16 bytes in 1 messages and its cap is 32"},
		{"corrupt", func(l *MemLog) error {
			for _, m := range l.msgs {
				m.data[1] = 7 // memory corruption behind the log's back
			}
			return l.Read("act>1", 3, 0, make([]float32, 4))
		}, "fails its CRC-32C"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewMemLog(32)
			if err := l.Append("act>1", 3, 0, msg); err != nil {
				t.Fatal(err)
			}
			err := tc.do(l)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestMemLogTruncate(t *testing.T) {
	l := NewMemLog(1 << 20)
	for s := int64(1); s <= 6; s++ {
		for seq := 0; seq < 2; seq++ {
			for _, st := range []string{"act>2", "grad>0"} {
				if err := l.Append(st, s, seq, []float32{float32(s), float32(seq)}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if err := l.Truncate(4); err != nil {
		t.Fatal(err)
	}
	for _, st := range []string{"act>2", "grad>0"} {
		if got, _ := l.Steps(st); fmt.Sprint(got) != "[5 6]" {
			t.Errorf("%s: steps %v after Truncate(4), want [5 6]", st, got)
		}
	}
	if got, want := l.Bytes(), int64(2*2*2*8); got != want {
		t.Errorf("holds %d bytes, want %d", got, want)
	}
}
