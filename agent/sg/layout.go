package sg

import (
	"fmt"
	"strings"
)

// Dim is one parallel dimension.
type Dim uint8

// The three dimensions of hybrid parallelism.
const (
	TP Dim = iota // tensor parallel
	DP            // data parallel
	PP            // pipeline parallel
)

func (d Dim) String() string {
	switch d {
	case TP:
		return "tp"
	case DP:
		return "dp"
	case PP:
		return "pp"
	}
	return fmt.Sprintf("Dim(%d)", uint8(d))
}

// Order lists the three dimensions from the fastest-varying to the slowest.
// Order{TP, DP, PP}, written "tp-dp-pp", is Megatron-LM's default
// ("tp-cp-ep-dp-pp" without cp and ep): the tp ranks of one (dp, pp) are
// consecutive, so
//
//	rank = tp + TP*(dp + DP*pp)
//
// In general, with Order{a, b, c}: rank = a + A*(b + B*c), where a, b, c are
// the rank's coordinates and A, B the sizes of the first two dimensions.
type Order [3]Dim

// Megatron is the default order, "tp-dp-pp".
var Megatron = Order{TP, DP, PP}

// DefaultOrder is Megatron's order as written on the command line.
const DefaultOrder = "tp-dp-pp"

func (o Order) String() string {
	return o[0].String() + "-" + o[1].String() + "-" + o[2].String()
}

// ParseOrder reads an order such as "tp-dp-pp": the three names tp, dp and
// pp, each once, joined by '-', fastest-varying first. Case and blanks
// around names are ignored.
func ParseOrder(s string) (Order, error) {
	parts := strings.Split(strings.ToLower(strings.TrimSpace(s)), "-")
	if len(parts) != 3 {
		return Order{}, fmt.Errorf("rank order %q: want the three dimensions tp, dp and pp joined by '-', fastest-varying first, as in %s", s, DefaultOrder)
	}
	var o Order
	seen := map[Dim]bool{}
	for i, p := range parts {
		var d Dim
		switch strings.TrimSpace(p) {
		case "tp":
			d = TP
		case "dp":
			d = DP
		case "pp":
			d = PP
		default:
			return Order{}, fmt.Errorf("rank order %q: unknown dimension %q; use tp, dp and pp, as in %s", s, p, DefaultOrder)
		}
		if seen[d] {
			return Order{}, fmt.Errorf("rank order %q: %s given twice; name each of tp, dp and pp once, as in %s", s, d, DefaultOrder)
		}
		seen[d] = true
		o[i] = d
	}
	return o, nil
}

func (o Order) valid() bool {
	return o[0] != o[1] && o[1] != o[2] && o[0] != o[2] && o[0] <= PP && o[1] <= PP && o[2] <= PP
}

// Layout is the parallel layout of a job: world size = DP x PP x TP.
type Layout struct {
	DP, PP, TP int
	// Order maps ranks to coordinates; the zero value means Megatron.
	Order Order
}

// MaxWorld bounds the world size, as a guard against typing mistakes.
const MaxWorld = 1 << 22

// order returns the effective order: the zero Order (tp-tp-tp, never
// valid) stands for Megatron's.
func (l Layout) order() Order {
	if l.Order == (Order{}) {
		return Megatron
	}
	return l.Order
}

// Validate checks sizes and order.
func (l Layout) Validate() error {
	if l.DP < 1 || l.PP < 1 || l.TP < 1 {
		return fmt.Errorf("layout dp=%d pp=%d tp=%d: each must be >= 1", l.DP, l.PP, l.TP)
	}
	if int64(l.DP)*int64(l.PP)*int64(l.TP) > MaxWorld {
		return fmt.Errorf("layout dp=%d pp=%d tp=%d: world size over %d", l.DP, l.PP, l.TP, MaxWorld)
	}
	if !l.order().valid() {
		return fmt.Errorf("layout order %v: each of tp, dp and pp must appear once", l.Order)
	}
	return nil
}

// World is the number of ranks.
func (l Layout) World() int { return l.DP * l.PP * l.TP }

// Coord is a rank's position in the layout.
type Coord struct{ DP, PP, TP int }

func (l Layout) size(d Dim) int {
	switch d {
	case TP:
		return l.TP
	case DP:
		return l.DP
	}
	return l.PP
}

func (c *Coord) at(d Dim) *int {
	switch d {
	case TP:
		return &c.TP
	case DP:
		return &c.DP
	}
	return &c.PP
}

// Coord returns the coordinates of rank r (0 <= r < World()).
func (l Layout) Coord(r int) Coord {
	var c Coord
	for _, d := range l.order() {
		n := l.size(d)
		*c.at(d) = r % n
		r /= n
	}
	return c
}

// Rank is the inverse of Coord.
func (l Layout) Rank(c Coord) int {
	o := l.order()
	r := 0
	for i := 2; i >= 0; i-- {
		r = r*l.size(o[i]) + *c.at(o[i])
	}
	return r
}

func (l Layout) String() string {
	return fmt.Sprintf("dp=%d pp=%d tp=%d order %s", l.DP, l.PP, l.TP, l.order())
}
