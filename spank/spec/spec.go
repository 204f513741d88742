// Package spec parses and normalizes the value of the `--reft=SPEC` option.
//
// Grammar:
//
//	SPEC  = MODES *( "," ( KEY "=" VALUE | "strict" ) )
//	MODES = "off" | MODE *( "+" MODE )
//	MODE  = "arc" | "aec" | "aec:" K | "aor"          (K >= 1)
//	KEY   = "dp" | "pp" | "tp" | "every" | "persist" | "spares" | "persist_dir"
//
// Values:
//
//	dp, pp, tp   positive integers; unset means "derive from the task count"
//	             (pure data parallel over all tasks).
//	every        snapshot interval in training steps, >= 0 (default 1). 0: no
//	             snapshot on the step path; a failure is covered by the JIT
//	             flush of the survivors' live state (docs/UNDO.md, "every=0").
//	persist      persistent checkpoint interval: "auto" (default, the JIT optimum),
//	             "off", a step count ("500") or a Go duration ("30m", "1h30m").
//	spares       number of spare nodes held in the allocation, >= 0 (default 0).
//	persist_dir  absolute path of the persistent checkpoint directory
//	             (default: from reft.toml).
//	strict       a flag, no value: when the snapshots' protection falls below
//	             what the modes promise (peering off, a peer lost, ranks
//	             protected on their own node only, failed saves; docs/METRICS.md)
//	             and stays there, the agent refuses the ranks' commits and the
//	             step fails, rather than train on less protected.
//
// The same SPEC is accepted by srun, sbatch, salloc and #SBATCH lines; the
// launcher, the agent and the client import this package so that every part of
// reft reads it the same way. [Spec.String] gives the canonical form: modes in
// the order arc, aec, aor; keys in the order above; keys at their default left
// out. Parse(s.String()) == s for every valid s.
package spec

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Limits on numeric values. They reject typing mistakes, not real jobs.
const (
	MaxParity  = 255     // aec:K, Reed-Solomon parity shards (with data shards, at most 256)
	MaxDim     = 1 << 20 // dp, pp, tp
	MaxEvery   = 1 << 30 // every, persist in steps
	MaxSpares  = 1 << 16 // spares
	MaxPathLen = 4096    // persist_dir
)

// ValidModes and ValidKeys are quoted in error messages and the option help.
const (
	ValidModes = "off, or arc, aec, aec:K (K>=1), aor joined by '+'"
	ValidKeys  = "dp, pp, tp, every, persist, spares, persist_dir, and the flag strict"
)

// PersistKind says how the persistent checkpoint interval is given.
type PersistKind int

// Persist kinds.
const (
	PersistAuto     PersistKind = iota // JIT optimum from config (the default)
	PersistOff                         // no persistent checkpoints
	PersistSteps                       // every Persist.Steps training steps
	PersistDuration                    // every Persist.Every of wall time
)

// Persist is the persistent checkpoint interval.
type Persist struct {
	Kind  PersistKind
	Steps int           // for PersistSteps
	Every time.Duration // for PersistDuration
}

// String renders the persist value as it is written in a SPEC.
func (p Persist) String() string {
	switch p.Kind {
	case PersistOff:
		return "off"
	case PersistSteps:
		return strconv.Itoa(p.Steps)
	case PersistDuration:
		return formatDuration(p.Every)
	default:
		return "auto"
	}
}

// Spec is a parsed --reft value. The zero value is not valid; use [Parse] or [Off].
type Spec struct {
	// Off is true for "off": the plugin is loaded but reft is disabled.
	Off bool
	// ARC, AEC and AOR are the protection modes; they combine.
	ARC, AEC, AOR bool
	// AECParity is 0 for plain "aec" (rotated XOR parity) and K for "aec:K"
	// (Reed-Solomon with K parity shards).
	AECParity int
	// DP, PP and TP are the layout; 0 means "derive from the task count".
	DP, PP, TP int
	// Every is the snapshot interval in steps: the clients snapshot the
	// steps that are multiples of it. 0: never on the step path, only the
	// JIT flush at a failure (Spec.JITOnly).
	Every int
	// Persist is the persistent checkpoint interval.
	Persist Persist
	// Spares is the number of spare nodes.
	Spares int
	// PersistDir overrides the persistent checkpoint directory of reft.toml.
	PersistDir string
	// Strict: a step whose protection falls below the modes' fails rather
	// than go on (the agent refuses its commits; agent.DegradedGrace).
	Strict bool
}

// Off returns the disabled spec.
func Off() Spec { return Spec{Off: true, Every: 1} }

// Enabled reports whether reft is on for this spec.
func (s Spec) Enabled() bool { return !s.Off }

// JITOnly reports whether reft is on with every=0: the ranks never snapshot
// on the step path, and a failure is covered only by the survivors' JIT
// flush of their live state (and the copies it makes across nodes).
func (s Spec) JITOnly() bool { return !s.Off && s.Every == 0 }

// Error is a SPEC error. Its message is one line that names the valid choices.
type Error struct {
	Spec string // the whole SPEC as given
	Msg  string // what is wrong and what is valid
}

func (e *Error) Error() string { return fmt.Sprintf("--reft=%s: %s", e.Spec, e.Msg) }

// Parse parses and validates a SPEC. Leading and trailing blanks around each
// element are ignored. Errors are *Error.
func Parse(in string) (Spec, error) {
	fail := func(format string, a ...any) (Spec, error) {
		return Spec{}, &Error{Spec: oneLine(in), Msg: fmt.Sprintf(format, a...)}
	}
	if strings.TrimSpace(in) == "" {
		return fail("empty value; valid modes: %s", ValidModes)
	}
	if strings.ContainsAny(in, "\n\r\x00") {
		return fail("contains a newline or NUL byte")
	}
	parts := strings.Split(in, ",")
	s := Spec{Every: 1}

	modes := strings.TrimSpace(parts[0])
	if strings.Contains(modes, "=") {
		return fail("must start with the modes, not a key (%q); valid modes: %s", modes, ValidModes)
	}
	if modes == "off" {
		s.Off = true
		if len(parts) > 1 {
			return fail("\"off\" takes no keys; remove %q or choose modes: %s", strings.Join(parts[1:], ","), ValidModes)
		}
		return s, nil
	}
	for _, m := range strings.Split(modes, "+") {
		m = strings.TrimSpace(m)
		switch {
		case m == "":
			return fail("empty mode in %q; valid modes: %s", modes, ValidModes)
		case m == "off":
			return fail("\"off\" cannot be combined with other modes; valid modes: %s", ValidModes)
		case m == "arc":
			if s.ARC {
				return fail("mode arc given twice")
			}
			s.ARC = true
		case m == "aor":
			if s.AOR {
				return fail("mode aor given twice")
			}
			s.AOR = true
		case m == "aec" || strings.HasPrefix(m, "aec:"):
			if s.AEC {
				return fail("mode aec given twice (use one of aec, aec:K)")
			}
			s.AEC = true
			if m != "aec" {
				k, err := parseInt(strings.TrimPrefix(m, "aec:"), 1, MaxParity)
				if err != nil {
					return fail("aec:K: %v (K is the Reed-Solomon parity count)", err)
				}
				s.AECParity = k
			}
		default:
			return fail("unknown mode %q; valid modes: %s", m, ValidModes)
		}
	}

	seen := map[string]bool{}
	for _, kv := range parts[1:] {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			return fail("empty key=value element (two commas?); valid keys: %s", ValidKeys)
		}
		if kv == "strict" {
			if s.Strict {
				return fail("strict given twice")
			}
			s.Strict = true
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if k == "strict" {
			return fail("strict is a flag and takes no value: write ,strict")
		}
		if !ok {
			return fail("%q is not key=value; valid keys: %s", kv, ValidKeys)
		}
		if !validKey(k) {
			return fail("unknown key %q; valid keys: %s", k, ValidKeys)
		}
		if seen[k] {
			return fail("key %s given twice", k)
		}
		seen[k] = true
		if v == "" {
			return fail("%s= needs a value", k)
		}
		var err error
		switch k {
		case "dp":
			s.DP, err = parseInt(v, 1, MaxDim)
		case "pp":
			s.PP, err = parseInt(v, 1, MaxDim)
		case "tp":
			s.TP, err = parseInt(v, 1, MaxDim)
		case "every":
			s.Every, err = parseInt(v, 0, MaxEvery)
		case "spares":
			s.Spares, err = parseInt(v, 0, MaxSpares)
		case "persist":
			s.Persist, err = parsePersist(v)
		case "persist_dir":
			s.PersistDir, err = parseDir(v)
		}
		if err != nil {
			return fail("%s=%s: %v", k, v, err)
		}
	}
	if s.JITOnly() && s.AOR {
		// AOR brings its replica forward at every snapshot from the
		// previous one; with none on the step path it would never be valid.
		return fail("every=0 cannot be combined with aor, whose replica needs a snapshot every step: use arc or aec with every=0, or aor without it")
	}
	return s, nil
}

// Normalize parses in and returns its canonical form.
func Normalize(in string) (string, error) {
	s, err := Parse(in)
	if err != nil {
		return "", err
	}
	return s.String(), nil
}

// String returns the canonical SPEC.
func (s Spec) String() string {
	if s.Off {
		return "off"
	}
	var modes []string
	if s.ARC {
		modes = append(modes, "arc")
	}
	if s.AEC {
		if s.AECParity > 0 {
			modes = append(modes, "aec:"+strconv.Itoa(s.AECParity))
		} else {
			modes = append(modes, "aec")
		}
	}
	if s.AOR {
		modes = append(modes, "aor")
	}
	var b strings.Builder
	b.WriteString(strings.Join(modes, "+"))
	kv := func(k, v string) { b.WriteString("," + k + "=" + v) }
	if s.DP > 0 {
		kv("dp", strconv.Itoa(s.DP))
	}
	if s.PP > 0 {
		kv("pp", strconv.Itoa(s.PP))
	}
	if s.TP > 0 {
		kv("tp", strconv.Itoa(s.TP))
	}
	if s.Every != 1 {
		kv("every", strconv.Itoa(s.Every))
	}
	if s.Persist.Kind != PersistAuto {
		kv("persist", s.Persist.String())
	}
	if s.Spares > 0 {
		kv("spares", strconv.Itoa(s.Spares))
	}
	if s.PersistDir != "" {
		kv("persist_dir", s.PersistDir)
	}
	if s.Strict {
		b.WriteString(",strict")
	}
	return b.String()
}

func validKey(k string) bool {
	switch k {
	case "dp", "pp", "tp", "every", "persist", "spares", "persist_dir":
		return true
	}
	return false
}

func parseInt(v string, lo, hi int) (int, error) {
	if v == "" {
		return 0, fmt.Errorf("%q is not a whole number; valid: %d..%d", v, lo, hi)
	}
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%q is not a whole number; valid: %d..%d", v, lo, hi)
		}
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s is out of range; valid: %d..%d", v, lo, hi)
	}
	return n, nil
}

func parsePersist(v string) (Persist, error) {
	switch v {
	case "auto":
		return Persist{Kind: PersistAuto}, nil
	case "off":
		return Persist{Kind: PersistOff}, nil
	}
	if v[0] >= '0' && v[0] <= '9' && strings.Trim(v, "0123456789") == "" {
		n, err := parseInt(v, 1, MaxEvery)
		if err != nil {
			return Persist{}, errors.New(err.Error() + " steps, or a duration like 30m, or auto, or off")
		}
		return Persist{Kind: PersistSteps, Steps: n}, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || strings.HasPrefix(v, "-") || strings.HasPrefix(v, "+") {
		return Persist{}, fmt.Errorf("valid: auto, off, a step count (500) or a duration (30m, 1h30m)")
	}
	if d < time.Second {
		return Persist{}, fmt.Errorf("duration %s is below 1s; valid: auto, off, a step count or a duration >= 1s", v)
	}
	if d%time.Second != 0 {
		return Persist{}, fmt.Errorf("duration %s is not a whole number of seconds", v)
	}
	return Persist{Kind: PersistDuration, Every: d}, nil
}

func parseDir(v string) (string, error) {
	if !strings.HasPrefix(v, "/") {
		return "", fmt.Errorf("must be an absolute path")
	}
	if len(v) > MaxPathLen {
		return "", fmt.Errorf("path longer than %d bytes", MaxPathLen)
	}
	return filepath.Clean(v), nil
}

// formatDuration writes whole-second durations without zero components:
// 30m, 1h30m, 90s -> 1m30s.
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func oneLine(s string) string {
	s = strings.NewReplacer("\n", `\n`, "\r", `\r`, "\x00", `\0`).Replace(s)
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}
