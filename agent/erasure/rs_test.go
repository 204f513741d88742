package erasure

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestNewRSParams(t *testing.T) {
	tests := []struct {
		m, k int
		msg  string
	}{
		{0, 1, "at least 1"},
		{4, 0, "at least 1"},
		{200, 57, "256"},
	}
	for _, tc := range tests {
		if _, err := NewRS(tc.m, tc.k); !errors.Is(err, ErrParams) || !strings.Contains(err.Error(), tc.msg) {
			t.Fatalf("NewRS(%d, %d) err = %v, want ErrParams containing %q", tc.m, tc.k, err, tc.msg)
		}
	}
}

// rsWord splits a w-byte slice into m data shards and encodes k parities.
func rsWord(t testing.TB, m, k, w int, seed uint64) (*RS, []byte, [][]byte) {
	t.Helper()
	r, err := NewRS(m, k)
	if err != nil {
		t.Fatal(err)
	}
	slice := randBytes(seed, w)
	shards := r.Split(slice)
	if err := r.Encode(shards); err != nil {
		t.Fatalf("m=%d k=%d w=%d: %v", m, k, w, err)
	}
	return r, slice, shards
}

// Every loss set of up to K shards (data and parity) is rebuilt; the
// rebuilt data, cut to the original lengths, is the slice. K+1 fail,
// naming the missing shards and the tolerance.
func TestRSEveryLossSet(t *testing.T) {
	for m := 1; m <= 8; m++ {
		for k := 1; k <= 4; k++ {
			for _, w := range []int{0, 1, m - 1, m + 1, 997, 4096} {
				if w < 0 {
					continue
				}
				r, slice, word := rsWord(t, m, k, w, uint64(m*100+k*10+w))
				n := r.ShardSize(w)
				for i, s := range word {
					if i >= m && len(s) != n {
						t.Fatalf("parity %d has %d bytes, want %d", i, len(s), n)
					}
				}
				subsets(m+k, k, func(lost []int) {
					shards := make([][]byte, m+k)
					for i := range word {
						shards[i] = clone(word[i])
					}
					for _, i := range lost {
						shards[i] = nil
					}
					if err := r.Reconstruct(shards); err != nil {
						t.Fatalf("m=%d k=%d w=%d lost %v: %v", m, k, w, lost, err)
					}
					var joined []byte
					for i := range m {
						got := shards[i][:len(word[i])]
						if !bytes.Equal(got, word[i]) || bytes.ContainsFunc(shards[i][len(word[i]):], func(r rune) bool { return r != 0 }) {
							t.Fatalf("m=%d k=%d w=%d lost %v: data shard %d differs", m, k, w, lost, i)
						}
						joined = append(joined, got...)
					}
					if !bytes.Equal(joined, slice) {
						t.Fatalf("m=%d k=%d w=%d lost %v: joined data differs", m, k, w, lost)
					}
					for i := m; i < m+k; i++ {
						if !bytes.Equal(shards[i], word[i]) {
							t.Fatalf("m=%d k=%d w=%d lost %v: parity %d differs", m, k, w, lost, i)
						}
					}
				})
				if m+k < k+1 {
					continue
				}
				subsetsOfSize(m+k, k+1, func(lost []int) {
					shards := make([][]byte, m+k)
					copy(shards, word)
					for _, i := range lost {
						shards[i] = nil
					}
					err := r.Reconstruct(shards)
					if !errors.Is(err, ErrTooManyLosses) || !strings.Contains(err.Error(), fmt.Sprintf("tolerates %d", k)) || !strings.Contains(err.Error(), r.shardName(lost[0])) {
						t.Fatalf("m=%d k=%d lost %v: err = %v", m, k, lost, err)
					}
				})
			}
		}
	}
}

// Equal-length shards reach klauspost untouched: the parity lands in the
// caller's buffers, and a missing shard's rebuild is the only allocation.
func TestRSNoCopyForEqualShards(t *testing.T) {
	r, _, word := rsWord(t, 4, 2, 4096, 1)
	par := [][]byte{make([]byte, 1024), make([]byte, 1024)}
	shards := append(word[:4:4], par...)
	if err := r.Encode(shards); err != nil {
		t.Fatal(err)
	}
	if &shards[4][0] != &par[0][0] || !bytes.Equal(par[0], word[4]) {
		t.Fatal("parity not written into the caller's buffer")
	}
	ours := testing.AllocsPerRun(5, func() {
		if err := r.Encode(shards); err != nil {
			t.Fatal(err)
		}
	})
	direct := testing.AllocsPerRun(5, func() {
		if err := r.enc.Encode(shards); err != nil {
			t.Fatal(err)
		}
	})
	if ours > direct {
		t.Fatalf("Encode of equal shards allocated %v times, klauspost alone %v; want no copies", ours, direct)
	}
}

func TestRSRejectsBadShards(t *testing.T) {
	r, _, word := rsWord(t, 3, 2, 300, 2)
	tests := []struct {
		name   string
		shards func() [][]byte
		enc    bool
		want   error
		msg    string
	}{
		{"count", func() [][]byte { return word[:4] }, true, ErrSize, "got 4 shards"},
		{"nil data on encode", func() [][]byte {
			s := append([][]byte(nil), word...)
			s[1] = nil
			return s
		}, true, ErrSize, "data shard 1 is nil"},
		{"parity size on encode", func() [][]byte {
			s := append([][]byte(nil), word...)
			s[3] = make([]byte, 7)
			return s
		}, true, ErrSize, "parity shard 0 (index 3) has 7 bytes"},
		{"parities disagree", func() [][]byte {
			s := append([][]byte(nil), word...)
			s[0], s[4] = nil, s[4][:50]
			return s
		}, false, ErrSize, "disagree"},
		{"data longer than parity", func() [][]byte {
			s := append([][]byte(nil), word...)
			s[0], s[1] = nil, append(clone(s[1]), 1)
			return s
		}, false, ErrSize, "longer than"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.enc {
				err = r.Encode(tc.shards())
			} else {
				err = r.Reconstruct(tc.shards())
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.want, tc.msg)
			}
		})
	}
}
