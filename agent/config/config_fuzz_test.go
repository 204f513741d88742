package config

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// FuzzParse: reft.toml is the admin's, but Parse must still never panic on
// any bytes; its errors name the file and stay on one line (they reach
// the job's stderr), and what it accepts passes Validate.
func FuzzParse(f *testing.F) {
	shipped, err := os.ReadFile("../../etc/reft.toml")
	if err != nil {
		f.Fatal(err)
	}
	// The shipped file with every documented default uncommented.
	all := regexp.MustCompile(`(?m)^# ([a-z_]+ = )`).ReplaceAll(shipped, []byte("$1"))
	for _, s := range [][]byte{shipped, all, nil,
		[]byte("[store]\nmemory_budget = \"50%\"\nchunk_size = \"4MiB\"\n"),
		[]byte("[store]\nmemory_budget = 1.5\n"),
		[]byte("[protect]\nbackground_rate = \"unlimited\"\nbackground_burst = 0\n"),
		[]byte("[agent]\nport_range = [47999, 47000]\n"),
		[]byte("[topology]\ndomains = { n1 = \"a\", \"n[2-3]\" = \"b\" }\n"),
		[]byte("[topology]\ndomain_pattern = \"(\"\n"),
		[]byte("[detect]\ninterval = \"1s\"\ntimeout = \"1s\"\n"),
		[]byte("[Store]\nx = 1\n"), []byte("a.b.c = 1\n[[x]]\n"), []byte("[store\n"),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("reft.toml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "reft config reft.toml") || strings.ContainsAny(err.Error(), "\n\r") {
				t.Fatalf("error %q does not name the file on one line", err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted a config that fails Validate: %v", err)
		}
	})
}
