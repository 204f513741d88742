// Package plan implements `reft plan`: the reliability and cost models that
// help a user choose a protection mode and a persistent-checkpoint interval
// before a large job starts. Each model follows one paper equation; see
// docs/PLAN.md for how each term was read.
package plan

import (
	"fmt"
	"strconv"
	"strings"
)

// Component is one protection scheme inside a mode spec such as "arc+aec:2".
type Component struct {
	Name string // arc, aec, aor or off
	K    int    // copies (arc), parity pieces (aec) or 1 (aor); 0 for off
}

// Mode is a parsed --mode value. Schemes combine (REFT "collaborative
// protection"): each adds its own tolerance, so arc+aec survives two losses
// per sharding group.
type Mode struct {
	Spec       string
	Components []Component
}

// ParseMode reads specs like "arc", "aec:2", "arc+aec", "aor", "off".
func ParseMode(spec string) (Mode, error) {
	spec = strings.TrimSpace(strings.ToLower(spec))
	if spec == "" {
		return Mode{}, fmt.Errorf("--mode is empty; use arc, aec, aec:K, aor, off or a '+' combination such as arc+aec")
	}
	m := Mode{Spec: spec}
	parts := strings.Split(spec, "+")
	for _, p := range parts {
		name, arg, hasArg := strings.Cut(p, ":")
		c := Component{Name: name, K: 1}
		switch name {
		case "arc", "aec":
			if hasArg {
				k, err := strconv.Atoi(arg)
				if err != nil || k < 1 {
					return Mode{}, fmt.Errorf("--mode %q: %s:%s needs a whole number >= 1 after the colon, as in %s:2", spec, name, arg, name)
				}
				c.K = k
			}
		case "aor":
			if hasArg {
				return Mode{}, fmt.Errorf("--mode %q: aor takes no count; write aor", spec)
			}
		case "off":
			if hasArg || len(parts) > 1 {
				return Mode{}, fmt.Errorf("--mode %q: off cannot be combined or given a count; write off alone", spec)
			}
			c.K = 0
		default:
			return Mode{}, fmt.Errorf("--mode %q: unknown scheme %q; use arc, arc:R, aec, aec:K, aor or off, joined with '+'", spec, name)
		}
		m.Components = append(m.Components, c)
	}
	return m, nil
}

// Tolerance is the number of member losses per sharding group the mode
// survives: arc:R keeps R extra copies, aec:K keeps K parity pieces, aor one
// optimizer replica; combinations add up.
func (m Mode) Tolerance() int {
	t := 0
	for _, c := range m.Components {
		t += c.K
	}
	return t
}

// checkTolerance rejects a mode that claims to survive losing the whole SG.
func (m Mode) checkTolerance(sgSize int) error {
	if t := m.Tolerance(); t >= sgSize {
		return fmt.Errorf("--mode %s tolerates %d losses per sharding group but --sg-size is %d; a group of n members survives at most n-1 losses, so raise --sg-size or lower the mode", m.Spec, t, sgSize)
	}
	return nil
}
