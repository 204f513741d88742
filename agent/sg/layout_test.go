package sg

import (
	"strings"
	"testing"
)

func TestParseOrder(t *testing.T) {
	tests := []struct {
		in      string
		want    Order
		wantErr string
	}{
		{"tp-dp-pp", Order{TP, DP, PP}, ""},
		{" TP-PP-DP ", Order{TP, PP, DP}, ""},
		{"dp-tp-pp", Order{DP, TP, PP}, ""},
		{"pp-dp-tp", Order{PP, DP, TP}, ""},
		{"tp-dp", Order{}, "three dimensions"},
		{"tp-dp-pp-cp", Order{}, "three dimensions"},
		{"tp-dp-cp", Order{}, `unknown dimension "cp"`},
		{"tp-tp-pp", Order{}, "tp given twice"},
		{"", Order{}, "three dimensions"},
	}
	for _, tt := range tests {
		got, err := ParseOrder(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseOrder(%q) err %v, want %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseOrder(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
		if back, _ := ParseOrder(got.String()); back != got {
			t.Errorf("ParseOrder(%v.String()) = %v", got, back)
		}
	}
}

// TestMegatronFormula pins the documented meaning: the first dimension of
// the order varies fastest.
func TestMegatronFormula(t *testing.T) {
	l := Layout{DP: 3, PP: 2, TP: 4} // zero Order: Megatron
	for r := 0; r < l.World(); r++ {
		c := l.Coord(r)
		if want := c.TP + l.TP*(c.DP+l.DP*c.PP); want != r {
			t.Fatalf("rank %d -> %+v, which the tp-dp-pp formula maps to %d", r, c, want)
		}
	}
	if got := (Layout{DP: 2, PP: 2, TP: 2, Order: Order{DP, TP, PP}}).Coord(1); got != (Coord{DP: 1}) {
		t.Errorf("dp-tp-pp: rank 1 = %+v, want dp=1", got)
	}
	if (Layout{DP: 1, PP: 1, TP: 1}).String() != "dp=1 pp=1 tp=1 order tp-dp-pp" {
		t.Errorf("String = %q", (Layout{DP: 1, PP: 1, TP: 1}).String())
	}
}

func TestCoordRankBijection(t *testing.T) {
	orders := []Order{{TP, DP, PP}, {TP, PP, DP}, {DP, TP, PP}, {DP, PP, TP}, {PP, TP, DP}, {PP, DP, TP}}
	for _, o := range orders {
		for _, sz := range [][3]int{{1, 1, 1}, {2, 3, 4}, {5, 1, 2}, {3, 3, 1}} {
			l := Layout{DP: sz[0], PP: sz[1], TP: sz[2], Order: o}
			if err := l.Validate(); err != nil {
				t.Fatal(err)
			}
			seen := map[Coord]bool{}
			for r := 0; r < l.World(); r++ {
				c := l.Coord(r)
				if c.DP >= l.DP || c.PP >= l.PP || c.TP >= l.TP || seen[c] {
					t.Fatalf("%v: rank %d -> %+v out of range or repeated", l, r, c)
				}
				seen[c] = true
				if back := l.Rank(c); back != r {
					t.Fatalf("%v: Rank(Coord(%d)) = %d", l, r, back)
				}
			}
		}
	}
}

func TestLayoutValidate(t *testing.T) {
	for _, l := range []Layout{{DP: 0, PP: 1, TP: 1}, {DP: 1, PP: -1, TP: 1}, {DP: 1 << 12, PP: 1 << 12, TP: 2}, {DP: 1, PP: 1, TP: 1, Order: Order{DP, DP, PP}}} {
		if err := l.Validate(); err == nil {
			t.Errorf("%+v: no error", l)
		}
	}
}
