package tmpfs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFreshDir: the message log's directory is made 0700 in the job's
// directory and emptied of what an earlier agent left (a symlink there is
// removed, never followed), and names the re-index or the lock would
// misread are refused.
func TestFreshDir(t *testing.T) {
	root := t.TempDir()
	s := openStore(t, root, nil)
	for _, bad := range []string{"", "r0", "rlog", "a/b", LockName} {
		if _, _, err := s.FreshDir(bad); err == nil || !strings.Contains(err.Error(), "cannot name") {
			t.Errorf("FreshDir(%q): %v, want a refusal", bad, err)
		}
	}
	d, n, err := s.FreshDir("msglog")
	if err != nil || n != 0 || d != filepath.Join(s.Dir(), "msglog") {
		t.Fatalf("first FreshDir: %s, %d removed, %v", d, n, err)
	}
	st, err := os.Lstat(d)
	if err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
		t.Fatalf("%s: %v, mode %v", d, err, st.Mode())
	}
	outside := filepath.Join(root, "outside")
	if err := os.WriteFile(outside, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "arena-0"), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(d, "arena-1")); err != nil {
		t.Fatal(err)
	}
	if _, n, err := s.FreshDir("msglog"); err != nil || n != 2 {
		t.Fatalf("FreshDir over an earlier agent's files: %d removed, %v; want 2", n, err)
	}
	if ents, _ := os.ReadDir(d); len(ents) != 0 {
		t.Fatalf("%d entries left in %s", len(ents), d)
	}
	if _, err := os.Stat(outside); err != nil {
		t.Fatalf("the symlink's target was touched: %v", err)
	}
	// The store's re-index does not take the directory for a rank.
	s.Close()
	s = openStore(t, root, nil)
	if keys := s.Keys(); len(keys) != 0 {
		t.Fatalf("re-index found keys %v", keys)
	}
}
