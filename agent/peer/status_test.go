package peer

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestStatus: a status request is answered with the server's Status,
// for an agent and for a status tool; a status tool's connection answers
// nothing else, and a role the listener does not know is refused.
func TestStatus(t *testing.T) {
	type reply struct {
		Node string `json:"node"`
		N    int    `json:"n"`
	}
	for _, tc := range []struct {
		name       string
		role       string
		status     bool   // the server serves status
		wantStatus string // "" : a reply; else the error's substring
		wantData   string // watermarks afterwards: "" : allowed; else the error's substring
	}{
		{name: "agent", status: true},
		{name: "status tool", role: RoleStatus, status: true, wantData: `may ask for status only, not watermarks`},
		{name: "no status served", status: false, wantStatus: "serves no status"},
		{name: "unknown role", role: "admin", status: true, wantStatus: `dialer role "admin"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lc, dc := baseConfig(t, "listener"), baseConfig(t, "reft-status@login")
			if tc.status {
				lc.Status = func() any { return reply{Node: "listener", N: 3} }
			}
			dc.Role = tc.role
			src := newMemSource()
			src.add(key1, 4096, map[string][]byte{"b": pattern(4096, "x")})
			srv := startServer(t, lc, src)
			cl := newClient(t, dc)
			ctx := testCtx(t, 5*time.Second)
			addr := srv.Addr().String()
			node, raw, err := cl.Status(ctx, addr)
			if tc.wantStatus != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantStatus) {
					t.Fatalf("status: got %v (%s), want an error naming %q", err, raw, tc.wantStatus)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got reply
			if err := json.Unmarshal(raw, &got); err != nil || got != (reply{"listener", 3}) || node != "listener" {
				t.Fatalf("status from %q: %s (%v)", node, raw, err)
			}
			_, err = cl.Watermarks(ctx, addr, nil)
			switch {
			case tc.wantData == "" && err != nil:
				t.Fatalf("watermarks after status: %v", err)
			case tc.wantData != "" && (err == nil || !IsCode(err, CodeForbidden) || !strings.Contains(err.Error(), tc.wantData)):
				t.Fatalf("watermarks on a %q connection: got %v, want forbidden naming %q", tc.role, err, tc.wantData)
			}
		})
	}
}
