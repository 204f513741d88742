package tmpfs

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestSubDir: the message log's directory is made 0700 in the job's
// directory and kept with its files for the next agent; one made by
// someone else's hand (a symlink, a lax mode) is refused; names the
// re-index or the lock would misread are refused.
func TestSubDir(t *testing.T) {
	root := t.TempDir()
	s := openStore(t, root, nil)
	for _, bad := range []string{"", "r0", "rlog", "a/b", LockName, ".", ".."} {
		if _, err := s.SubDir(bad); err == nil || !strings.Contains(err.Error(), "cannot name") {
			t.Errorf("SubDir(%q): %v, want a refusal", bad, err)
		}
	}
	d, err := s.SubDir("msglog")
	if err != nil || d != filepath.Join(s.Dir(), "msglog") {
		t.Fatalf("first SubDir: %s, %v", d, err)
	}
	st, err := os.Lstat(d)
	if err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
		t.Fatalf("%s: %v, mode %v", d, err, st.Mode())
	}
	if err := os.WriteFile(filepath.Join(d, "arena-0"), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	// The next agent's store finds the directory and its file as left,
	// and its re-index does not take the directory for a rank.
	s.Close()
	s = openStore(t, root, nil)
	if keys := s.Keys(); len(keys) != 0 {
		t.Fatalf("re-index found keys %v", keys)
	}
	if d2, err := s.SubDir("msglog"); err != nil || d2 != d {
		t.Fatalf("second SubDir: %s, %v", d2, err)
	}
	if _, err := os.Stat(filepath.Join(d, "arena-0")); err != nil {
		t.Fatalf("the earlier agent's file is gone: %v", err)
	}

	cases := []struct {
		name string
		make func(path string) error
	}{
		{"a symlink to a directory", func(p string) error { return os.Symlink(t.TempDir(), p) }},
		{"a directory others may read", func(p string) error { return os.Mkdir(p, 0o755) }},
		{"a regular file", func(p string) error { return os.WriteFile(p, nil, 0o600) }},
	}
	for i, tc := range cases {
		name := "x" + strconv.Itoa(i)
		if err := tc.make(filepath.Join(s.Dir(), name)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.SubDir(name); err == nil || !strings.Contains(err.Error(), "refusing") {
			t.Errorf("%s: SubDir: %v, want a refusal", tc.name, err)
		}
	}
}
