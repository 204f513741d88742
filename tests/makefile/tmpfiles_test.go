package makefile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstallTmpfiles: make install ships the tmpfiles.d entries that create
// reft's root directories at boot, naming the state directory the plugin is
// built with, and keeps a site's edited copy.
func TestInstallTmpfiles(t *testing.T) {
	for _, tc := range []struct {
		name, stateDir string
		vars           []string
	}{
		{"default", "/run/reft/.plugin", nil},
		{"state dir", "/var/lib/reft-state", []string{"REFT_STATE_DIR=/var/lib/reft-state"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			build, dest := filepath.Join(tmp, "build"), filepath.Join(tmp, "dest")
			if err := os.MkdirAll(build, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, a := range []string{"reft", "reft-agent", "spank_reft.so", "libreft_spank.so"} {
				if err := os.WriteFile(filepath.Join(build, a), []byte("stand-in"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			makeInstall(t, build, dest, tc.vars...)
			p := filepath.Join(dest, "etc", "tmpfiles.d", "reft.conf")
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatalf("tmpfiles.d entry not installed: %v", err)
			}
			var entries []string
			for _, l := range strings.Split(string(b), "\n") {
				if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
					entries = append(entries, l)
				}
			}
			want := []string{
				"d /run/reft 0755 root root -",
				"d " + tc.stateDir + " 0700 root root -",
				"d /dev/shm/reft 0755 root root -",
			}
			if strings.Join(entries, "\n") != strings.Join(want, "\n") {
				t.Errorf("%s entries:\n%s\nwant:\n%s", p, strings.Join(entries, "\n"), strings.Join(want, "\n"))
			}
			edited := append(b, []byte("# edited\n")...)
			if err := os.WriteFile(p, edited, 0o644); err != nil {
				t.Fatal(err)
			}
			makeInstall(t, build, dest, tc.vars...)
			if got, _ := os.ReadFile(p); string(got) != string(edited) {
				t.Errorf("a second make install replaced the edited %s", p)
			}
		})
	}
}
