package hostmem

import (
	"fmt"
	"strconv"
	"strings"
)

// FormatBytes writes n in binary units, e.g. "1.5 GiB".
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	f, i := float64(n), -1
	for (f >= unit || f <= -unit) && i < 5 {
		f /= unit
		i++
	}
	return strings.TrimSuffix(fmt.Sprintf("%.1f", f), ".0") + " " + string("KMGTPE"[i]) + "iB"
}

// ParseBytes reads "4096", "4k", "512M", "8GiB", "1.5G" (binary units).
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, suf := t, ""
	if i >= 0 {
		num, suf = t[:i], strings.ToUpper(strings.TrimSpace(t[i:]))
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("hostmem: size %q: not a number", s)
	}
	suf = strings.TrimSuffix(strings.TrimSuffix(suf, "B"), "I")
	mult := map[string]float64{"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[suf]
	if mult == 0 {
		return 0, fmt.Errorf("hostmem: size %q: unknown unit (use K, M, G, T)", s)
	}
	return int64(f * mult), nil
}
