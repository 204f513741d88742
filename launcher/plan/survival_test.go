package plan

import (
	"math"
	"strings"
	"testing"
)

// fig8 is REFT Fig. 8's example: 3072 devices, 6 DP paths, c = 1.3,
// hardware 1e-4 and software 1e-5 per device.
var fig8 = Survival{Units: 3072, SGSize: 6, Shape: 1.3, HWRate: 1e-4, SWRate: 1e-5, Tolerance: 1}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

func TestFig8(t *testing.T) {
	reft, ck := fig8.ReftDays(0.9), fig8.CheckpointDays(0.9)
	if got := round(reft, 1); got != 16.2 {
		t.Errorf("reft days = %.4f, want about 16.2", reft)
	}
	// The paper prints 16.22; our exact solve of its Eq. 5 gives 16.18.
	if math.Abs(reft-16.22)/16.22 > 0.005 {
		t.Errorf("reft days = %.4f, more than 0.5%% from the paper's 16.22", reft)
	}
	if got := round(ck, 2); got != 0.41 {
		t.Errorf("checkpoint days = %.4f, want about 0.41", ck)
	}
}

// TestEq5Literal checks the generalised form against Eq. 5 and 6 written
// out as the paper prints them, with T = 1.
func TestEq5Literal(t *testing.T) {
	s := fig8
	s.AgentRate = 3e-6
	for _, day := range []float64{0.1, 1, 5, 16.22, 40} {
		ps := math.Exp(-s.HWRate * math.Pow(day, s.Shape))
		ptr := math.Exp(-s.SWRate * math.Pow(day, s.Shape))
		pre := math.Exp(-s.AgentRate * math.Pow(day, s.Shape))
		k, n := float64(s.Units), float64(s.SGSize)
		eq5 := math.Pow(math.Pow(ps, n)+n*(1-ps)*math.Pow(ps, n-1), k/n) * math.Pow(pre, k)
		eq6 := math.Pow(ps, k) * math.Pow(ptr, k)
		if got := s.Reft(day); math.Abs(got-eq5) > 1e-9 {
			t.Errorf("Reft(%g) = %.12f, Eq. 5 gives %.12f", day, got, eq5)
		}
		if got := s.Checkpoint(day); math.Abs(got-eq6) > 1e-12 {
			t.Errorf("Checkpoint(%g) = %.12g, Eq. 6 gives %.12g", day, got, eq6)
		}
	}
}

func TestToleranceGeneralisation(t *testing.T) {
	ps := func(day float64) float64 { return math.Exp(-fig8.HWRate * math.Pow(day, fig8.Shape)) }
	tests := []struct {
		mode string
		// literal per-SG survival for n = 6
		sg func(p float64) float64
		// days above 0.9, to one decimal (docs/PLAN.md quotes arc's and arc+aec's)
		days float64
	}{
		{"off", func(p float64) float64 { return math.Pow(p, 6) }, 0.4},
		{"arc", func(p float64) float64 { return math.Pow(p, 6) + 6*(1-p)*math.Pow(p, 5) }, 16.2},
		{"aec:2", func(p float64) float64 {
			return math.Pow(p, 6) + 6*(1-p)*math.Pow(p, 5) + 15*math.Pow(1-p, 2)*math.Pow(p, 4)
		}, 64.2},
		{"arc+aec", func(p float64) float64 {
			return math.Pow(p, 6) + 6*(1-p)*math.Pow(p, 5) + 15*math.Pow(1-p, 2)*math.Pow(p, 4)
		}, 64.2},
	}
	prev := 0.0
	for _, tc := range tests {
		m, err := ParseMode(tc.mode)
		if err != nil {
			t.Fatal(err)
		}
		s := fig8
		s.Tolerance = m.Tolerance()
		for _, day := range []float64{2, 20, 60} {
			want := math.Pow(tc.sg(ps(day)), 512)
			if got := s.Reft(day); math.Abs(got-want) > 1e-9 {
				t.Errorf("%s: Reft(%g) = %.10f, want %.10f", tc.mode, day, got, want)
			}
		}
		d := s.ReftDays(0.9)
		if math.Round(d*10)/10 != tc.days {
			t.Errorf("%s: %.4f days above 0.9, want %.1f", tc.mode, d, tc.days)
		}
		if got := s.Reft(d); math.Abs(got-0.9) > 1e-9 {
			t.Errorf("%s: Reft(ReftDays) = %.12f, want 0.9", tc.mode, got)
		}
		if d < prev {
			t.Errorf("%s: %.3f days, fewer than a weaker mode's %.3f", tc.mode, d, prev)
		}
		prev = d
	}
}

func TestSurvivalNoFailures(t *testing.T) {
	s := fig8
	s.HWRate, s.SWRate = 0, 0
	if d := s.ReftDays(0.9); !math.IsInf(d, 1) {
		t.Errorf("ReftDays with no failures = %g, want +Inf", d)
	}
	if d := s.CheckpointDays(0.9); !math.IsInf(d, 1) {
		t.Errorf("CheckpointDays with no failures = %g, want +Inf", d)
	}
}

func TestSurvivalValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Survival)
		want string
	}{
		{"sg too small", func(s *Survival) { s.SGSize = 1 }, "--sg-size must be >= 2"},
		{"not a multiple", func(s *Survival) { s.Units = 3070 }, "multiple of --sg-size"},
		{"shape", func(s *Survival) { s.Shape = 0 }, "--shape must be > 0"},
		{"hw rate", func(s *Survival) { s.HWRate = -1 }, "--hw-rate must be >= 0"},
		{"devices", func(s *Survival) { s.Units = 0 }, "--devices must be >= 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := fig8
			tc.edit(&s)
			err := s.validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if err := fig8.validate(); err != nil {
		t.Errorf("Fig. 8 inputs rejected: %v", err)
	}
}
