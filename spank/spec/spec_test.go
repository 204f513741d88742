package spec

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseValid(t *testing.T) {
	tests := []struct {
		in, canon string
		check     func(Spec) bool
	}{
		{"off", "off", func(s Spec) bool { return s.Off && !s.Enabled() }},
		{"arc", "arc", func(s Spec) bool { return s.ARC && !s.AEC && !s.AOR && s.Every == 1 && s.Persist.Kind == PersistAuto }},
		{"aec", "aec", func(s Spec) bool { return s.AEC && s.AECParity == 0 }},
		{"aec:2", "aec:2", func(s Spec) bool { return s.AEC && s.AECParity == 2 }},
		{"aec:1", "aec:1", func(s Spec) bool { return s.AECParity == 1 }},
		{"aor", "aor", func(s Spec) bool { return s.AOR }},
		{"aec+arc", "arc+aec", func(s Spec) bool { return s.ARC && s.AEC }},
		{"aor+aec:3+arc", "arc+aec:3+aor", func(s Spec) bool { return s.ARC && s.AOR && s.AECParity == 3 }},
		{"arc+aec,dp=4", "arc+aec,dp=4", func(s Spec) bool { return s.DP == 4 }},
		{"arc,tp=2,pp=3,dp=4", "arc,dp=4,pp=3,tp=2", func(s Spec) bool { return s.DP == 4 && s.PP == 3 && s.TP == 2 }},
		{"arc,every=1", "arc", func(s Spec) bool { return s.Every == 1 }},
		{"arc,every=10", "arc,every=10", func(s Spec) bool { return s.Every == 10 && !s.JITOnly() }},
		{"arc,every=0", "arc,every=0", func(s Spec) bool { return s.Every == 0 && s.JITOnly() }},
		{"aec:2+arc,every=00,spares=1", "arc+aec:2,every=0,spares=1", func(s Spec) bool { return s.JITOnly() && s.Spares == 1 }},
		{"arc", "arc", func(s Spec) bool { return !s.JITOnly() }},
		{"arc,persist=auto", "arc", func(s Spec) bool { return s.Persist.Kind == PersistAuto }},
		{"arc,persist=off", "arc,persist=off", func(s Spec) bool { return s.Persist.Kind == PersistOff }},
		{"arc,persist=500", "arc,persist=500", func(s Spec) bool { return s.Persist.Kind == PersistSteps && s.Persist.Steps == 500 }},
		{"arc,persist=30m", "arc,persist=30m", func(s Spec) bool { return s.Persist.Every == 30*time.Minute }},
		{"arc,persist=90m", "arc,persist=1h30m", func(s Spec) bool { return s.Persist.Every == 90*time.Minute }},
		{"arc,persist=3600s", "arc,persist=1h", func(s Spec) bool { return s.Persist.Every == time.Hour }},
		{"arc,spares=0", "arc", func(s Spec) bool { return s.Spares == 0 }},
		{"arc,spares=2", "arc,spares=2", func(s Spec) bool { return s.Spares == 2 }},
		{"arc,persist_dir=/scratch/ckpt/", "arc,persist_dir=/scratch/ckpt", func(s Spec) bool { return s.PersistDir == "/scratch/ckpt" }},
		{"arc,persist_dir=/a=b+c", "arc,persist_dir=/a=b+c", func(s Spec) bool { return s.PersistDir == "/a=b+c" }},
		{" arc + aec , dp = 2 ", "arc+aec,dp=2", func(s Spec) bool { return s.DP == 2 }},
		{"arc,dp=01", "arc,dp=1", func(s Spec) bool { return s.DP == 1 }},
		{"arc,strict", "arc,strict", func(s Spec) bool { return s.Strict }},
		{"arc, strict ,dp=2", "arc,dp=2,strict", func(s Spec) bool { return s.Strict && s.DP == 2 }},
		{"arc+aec,dp=4", "arc+aec,dp=4", func(s Spec) bool { return !s.Strict }},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			s, err := Parse(tt.in)
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.in, err)
			}
			if !tt.check(s) {
				t.Errorf("Parse(%q) = %+v: check failed", tt.in, s)
			}
			if got := s.String(); got != tt.canon {
				t.Errorf("Parse(%q).String() = %q, want %q", tt.in, got, tt.canon)
			}
			again, err := Parse(s.String())
			if err != nil || again != s {
				t.Errorf("round trip of %q: %+v, %v; want %+v", s.String(), again, err, s)
			}
		})
	}
}

func TestParseInvalid(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", "empty value; valid modes: off, or arc, aec, aec:K (K>=1), aor joined by '+'"},
		{"   ", "empty value"},
		{"foo", `unknown mode "foo"; valid modes: off, or arc`},
		{"ARC", `unknown mode "ARC"`},
		{"arc+", `empty mode in "arc+"`},
		{"arc++aec", "empty mode"},
		{"arc+arc", "mode arc given twice"},
		{"aor+aor", "mode aor given twice"},
		{"aec+aec:2", "mode aec given twice"},
		{"off+arc", `"off" cannot be combined`},
		{"arc+off", `"off" cannot be combined`},
		{"off,dp=2", `"off" takes no keys`},
		{"aec:0", "aec:K: 0 is out of range; valid: 1..255"},
		{"aec:256", "out of range; valid: 1..255"},
		{"aec:", "is not a whole number"},
		{"aec:x", `"x" is not a whole number`},
		{"aec:-1", "not a whole number"},
		{"dp=4", "must start with the modes, not a key"},
		{"arc,foo=1", `unknown key "foo"; valid keys: dp, pp, tp, every, persist, spares, persist_dir, and the flag strict`},
		{"arc,strict,strict", "strict given twice"},
		{"arc,strict=1", "strict is a flag and takes no value: write ,strict"},
		{"arc,strict=", "strict is a flag and takes no value"},
		{"off,strict", `"off" takes no keys`},
		{"arc,DP=1", `unknown key "DP"`},
		{"arc,dp", `"dp" is not key=value; valid keys`},
		{"arc,,dp=1", "empty key=value element"},
		{"arc,", "empty key=value element"},
		{"arc,dp=", "dp= needs a value"},
		{"arc,dp=0", "dp=0: 0 is out of range; valid: 1..1048576"},
		{"arc,pp=-2", `pp=-2: "-2" is not a whole number`},
		{"arc,tp=1.5", "not a whole number"},
		{"arc,dp=99999999999999999999", "out of range"},
		{"arc,dp=2,dp=2", "key dp given twice"},
		{"arc,every=-1", `every=-1: "-1" is not a whole number; valid: 0..1073741824`},
		{"arc,every=1073741825", "every=1073741825: 1073741825 is out of range; valid: 0..1073741824"},
		{"aor,every=0", "every=0 cannot be combined with aor"},
		{"arc+aor,every=0", "every=0 cannot be combined with aor"},
		{"arc,spares=-1", "not a whole number"},
		{"arc,spares=70000", "out of range; valid: 0..65536"},
		{"arc,persist=0", "out of range"},
		{"arc,persist=soon", "valid: auto, off, a step count (500) or a duration (30m, 1h30m)"},
		{"arc,persist=-5m", "valid: auto, off"},
		{"arc,persist=500ms", "below 1s"},
		{"arc,persist=1.5s", "not a whole number of seconds"},
		{"arc,persist_dir=relative/dir", "must be an absolute path"},
		{"arc\n", "newline"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			_, err := Parse(tt.in)
			if err == nil {
				t.Fatalf("Parse(%q) succeeded, want error containing %q", tt.in, tt.want)
			}
			var se *Error
			if !errors.As(err, &se) {
				t.Fatalf("Parse(%q) error %T is not *Error", tt.in, err)
			}
			msg := err.Error()
			if !strings.Contains(msg, tt.want) {
				t.Errorf("Parse(%q) = %q, want it to contain %q", tt.in, msg, tt.want)
			}
			if strings.ContainsAny(msg, "\n\r") {
				t.Errorf("error for %q is not one line: %q", tt.in, msg)
			}
			if !strings.HasPrefix(msg, "--reft=") {
				t.Errorf("error %q does not name the option", msg)
			}
		})
	}
}

func TestNormalize(t *testing.T) {
	got, err := Normalize("aec+arc,every=1,dp=4")
	if err != nil || got != "arc+aec,dp=4" {
		t.Fatalf("Normalize = %q, %v", got, err)
	}
	if _, err := Normalize("nope"); err == nil {
		t.Fatal("Normalize(nope) succeeded")
	}
	if Off().String() != "off" || Off().Enabled() {
		t.Fatal("Off() is not off")
	}
}

// FuzzParse checks that Parse never panics, that errors are one line, and
// that the canonical form of every accepted SPEC parses back to the same Spec.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"off", "arc", "arc+aec:2+aor,dp=4,pp=2,tp=1,every=3,persist=30m,spares=1,persist_dir=/x",
		"arc,strict", "aec,strict,dp=2", "aec,persist=100", "arc,every=0", "aor,every=0", "arc,every=0,strict", "arc,,", "aec:", "arc,persist=1h0m1s", "x=y", "arc+aec,dp=4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s, err := Parse(in)
		if err != nil {
			if strings.ContainsAny(err.Error(), "\n\r") {
				t.Fatalf("multi-line error for %q: %q", in, err)
			}
			return
		}
		c := s.String()
		s2, err := Parse(c)
		if err != nil {
			t.Fatalf("canonical %q of %q does not parse: %v", c, in, err)
		}
		if s2 != s {
			t.Fatalf("round trip of %q via %q: %+v != %+v", in, c, s2, s)
		}
		if s2.String() != c {
			t.Fatalf("canonical form not stable: %q -> %q", c, s2.String())
		}
	})
}
