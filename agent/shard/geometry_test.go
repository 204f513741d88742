package shard

import (
	"slices"
	"strings"
	"testing"

	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/sg"
	"github.com/reft-hpc/reft/spank/spec"
)

func TestJobLayout(t *testing.T) {
	cases := []struct {
		spec, client string
		world        int
		want         sg.Layout
		err          string
	}{
		{"arc", "", 8, sg.Layout{DP: 8, PP: 1, TP: 1}, ""},
		{"arc", "dp=2,pp=2,tp=2", 8, sg.Layout{DP: 2, PP: 2, TP: 2}, ""},
		{"arc", "zero1=1 pp=4", 8, sg.Layout{DP: 2, PP: 4, TP: 1}, ""},
		{"arc,dp=4,pp=2", "dp=2,pp=4", 8, sg.Layout{DP: 4, PP: 2, TP: 1}, ""}, // the SPEC's win
		{"arc", "dp=3", 8, sg.Layout{}, "has 3 ranks but the job has world = 8"},
	}
	for _, tc := range cases {
		t.Run(tc.spec+" "+tc.client, func(t *testing.T) {
			sp, err := spec.Parse(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			got, err := JobLayout(sp, tc.client, tc.world)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("JobLayout = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func reg(rank int, layout string, bufs ...proto.BufferSpec) proto.Register {
	return proto.Register{Rank: rank, World: 4, Layout: layout, Buffers: bufs}
}

// TestNewGeometry: which registrations are sharded, and the geometry of
// those that are.
func TestNewGeometry(t *testing.T) {
	params := proto.BufferSpec{Name: "params", Size: 1000, Replicated: true}
	bias := proto.BufferSpec{Name: "bias", Size: 200, Replicated: true}
	rng := proto.BufferSpec{Name: "rng", Size: 8}
	cases := []struct {
		name, spec string
		req        proto.Register
		nilGeo     bool
		check      func(t *testing.T, g *Geometry)
	}{
		{name: "off", spec: "off", req: reg(1, "", params), nilGeo: true},
		{name: "dp=1", spec: "arc", req: reg(1, "dp=1,pp=4", params), nilGeo: true},
		{name: "nothing replicated", spec: "arc", req: reg(1, "", rng), nilGeo: true},
		{name: "arc", spec: "arc", req: reg(2, "", params, rng, bias), check: func(t *testing.T, g *Geometry) {
			if g.M != 4 || g.Pos != 2 || !slices.Equal(g.Members, []int{0, 1, 2, 3}) || !g.ARC || g.Whole || g.EL != nil {
				t.Errorf("geometry %+v", g)
			}
			if g.W != 1200 || !slices.Equal(g.Slice, []SliceBuf{{"params", 0, 1000}, {"bias", 1000, 200}}) || len(g.Other) != 1 {
				t.Errorf("slice %d %v, other %v", g.W, g.Slice, g.Other)
			}
			if g.Shard(g.Pos) != sg.ShardRange(1200, 4, 2) || g.Succ(3) != 0 || g.Pred(0) != 3 {
				t.Errorf("shard %v, succ(3) %d, pred(0) %d", g.Shard(g.Pos), g.Succ(3), g.Pred(0))
			}
			if g.Copies() != 1 || !slices.Equal(g.Placed(), []string{"rng"}) {
				t.Errorf("copies %d, placed %v", g.Copies(), g.Placed())
			}
		}},
		{name: "arc+aec:2", spec: "arc+aec:2", req: reg(0, "", params), check: func(t *testing.T, g *Geometry) {
			if g.K != 2 || g.EL == nil || g.Codec == nil || g.Decoder == nil || !g.EL.ARC() || g.Copies() != 3 {
				t.Errorf("aec geometry: k %d, layout %v, copies %d", g.K, g.EL, g.Copies())
			}
		}},
		{name: "pp=2: members of the rank's stage only", spec: "aec", req: reg(3, "dp=2,pp=2", params), check: func(t *testing.T, g *Geometry) {
			if g.M != 2 || g.Pos != 1 || !slices.Equal(g.Members, g.DPOrder()) || !slices.Contains(g.Members, 3) {
				t.Errorf("members %v, pos %d", g.Members, g.Pos)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sp, err := spec.Parse(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			g, err := NewGeometry(sp, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if (g == nil) != tc.nilGeo {
				t.Fatalf("NewGeometry = %+v, want nil: %v", g, tc.nilGeo)
			}
			if g != nil {
				tc.check(t, g)
			}
		})
	}
}

// TestWithRing: a ring of the members gives a copy with the rank's new
// position; anything else is refused and the original is untouched.
func TestWithRing(t *testing.T) {
	sp, _ := spec.Parse("arc")
	g, err := NewGeometry(sp, reg(1, "", proto.BufferSpec{Name: "p", Size: 64, Replicated: true}))
	if err != nil {
		t.Fatal(err)
	}
	r, err := g.WithRing([]int{3, 1, 0, 2})
	if err != nil || r.Pos != 1 || !slices.Equal(r.Members, []int{3, 1, 0, 2}) {
		t.Fatalf("WithRing: %+v, %v", r, err)
	}
	for _, bad := range [][]int{{0, 1, 2}, {0, 1, 2, 2}, {0, 1, 2, 5}} {
		if _, err := g.WithRing(bad); err == nil {
			t.Errorf("WithRing(%v) accepted", bad)
		}
	}
	if g.Pos != 1 || !slices.Equal(g.Members, []int{0, 1, 2, 3}) {
		t.Errorf("the original changed: pos %d, members %v", g.Pos, g.Members)
	}
}
