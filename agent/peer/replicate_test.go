package peer

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestReplicate: a replicate request reaches the listener's handler with
// the dialer's authenticated node name; the handler's refusal and a
// listener without a handler come back as error codes.
func TestReplicate(t *testing.T) {
	req := ReplicateRequest{GenKey: GenKey{Rank: 3, Shard: "state", Step: 12, Seq: 40}, Sections: []string{"opt.m", "opt.v"}}
	tests := []struct {
		name     string
		handler  func(from string, req ReplicateRequest) error
		wantCode string // "": accepted
	}{
		{"accepted", func(string, ReplicateRequest) error { return nil }, ""},
		{"refused", func(string, ReplicateRequest) error { return errors.New("rank 3 is not placed here") }, CodeInvalid},
		{"no handler", nil, CodeUnknownType},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var got []ReplicateRequest
			var from []string
			scfg := baseConfig(t, "holder")
			if tc.handler != nil {
				scfg.Replicate = func(f string, r ReplicateRequest) error {
					mu.Lock()
					got, from = append(got, r), append(from, f)
					mu.Unlock()
					return tc.handler(f, r)
				}
			}
			srv := startServer(t, scfg, newMemSource())
			cl := newClient(t, baseConfig(t, "owner"))
			err := cl.Replicate(testCtx(t, 10*time.Second), srv.Addr().String(), req)
			if tc.wantCode == "" {
				if err != nil {
					t.Fatal(err)
				}
			} else {
				var e *Error
				if !errors.As(err, &e) || e.Code != tc.wantCode {
					t.Fatalf("error %v, want code %s", err, tc.wantCode)
				}
				if tc.handler != nil && !strings.Contains(err.Error(), "not placed here") {
					t.Errorf("error %v does not carry the handler's reason", err)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if tc.handler == nil {
				return
			}
			if len(got) != 1 || got[0].GenKey != req.GenKey || !slices.Equal(got[0].Sections, req.Sections) || from[0] != "owner" {
				t.Fatalf("handler saw %+v from %v, want %+v from owner", got, from, req)
			}
		})
	}
}
