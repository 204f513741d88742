// Package symbols checks what the two SPANK libraries export: slurmstepd
// and slurmd load them as root, so each exports only its entry points
// (spank/shim.map, spank/plugin/libreft_spank.map; docs/SECURITY.md).
package symbols

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// build builds both libraries with the Makefile's own rules into a
// temporary directory.
func build(t *testing.T) string {
	t.Helper()
	out := t.TempDir()
	cmd := exec.Command("make", "-s", "BUILD="+out, out+"/spank_reft.so", out+"/libreft_spank.so")
	cmd.Dir = repoRoot(t)
	// An outer `make unit` must not pass its flags (-n, -j...) down.
	cmd.Env = append(os.Environ(), "MAKEFLAGS=", "MFLAGS=", "MAKELEVEL=")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make: %v\n%s", err, b)
	}
	return out
}

// exported is the set nm -D --defined-only lists.
func exported(t *testing.T, lib string) []string {
	t.Helper()
	b, err := exec.Command("nm", "-D", "--defined-only", lib).CombinedOutput()
	if err != nil {
		t.Fatalf("nm -D %s: %v\n%s", lib, err, b)
	}
	var syms []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if f := strings.Fields(line); len(f) == 3 {
			syms = append(syms, f[2])
		}
	}
	slices.Sort(syms)
	return syms
}

// sourceSymbols finds re's first group in the files matching glob.
func sourceSymbols(t *testing.T, glob string, re *regexp.Regexp, extra ...string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot(t), glob))
	if err != nil || len(files) == 0 {
		t.Fatalf("no files %s: %v", glob, err)
	}
	syms := append([]string(nil), extra...)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllSubmatch(b, -1) {
			syms = append(syms, string(m[1]))
		}
	}
	slices.Sort(syms)
	return slices.Compact(syms)
}

func TestExportedSymbols(t *testing.T) {
	dir := build(t)
	for _, tc := range []struct {
		lib  string
		want []string
	}{
		// every slurm_spank_* callback defined in shim.c, and the stamp
		{"spank_reft.so", sourceSymbols(t, "spank/shim.c", regexp.MustCompile(`(?m)^int (slurm_spank_\w+)\(`),
			"plugin_name", "plugin_type", "plugin_version", "spank_plugin_version")},
		// every //export of the Go library
		{"libreft_spank.so", sourceSymbols(t, "spank/plugin/*.go", regexp.MustCompile(`(?m)^//export (\w+)$`))},
	} {
		t.Run(tc.lib, func(t *testing.T) {
			if len(tc.want) < 4 {
				t.Fatalf("found only %v in the sources", tc.want)
			}
			got := exported(t, filepath.Join(dir, tc.lib))
			if !slices.Equal(got, tc.want) {
				t.Errorf("nm -D --defined-only %s:\n got %v\nwant %v", tc.lib, got, tc.want)
			}
		})
	}
}

// The Go library still loads and runs with its runtime's symbols local:
// dlopen it from C and call an entry point, as the shim does.
func TestGoLibraryLoads(t *testing.T) {
	dir := build(t)
	src := filepath.Join(dir, "load.c")
	prog := `#include <dlfcn.h>
#include <stdio.h>
typedef int (*normalize_fn)(char *, char *, int, char *, int);
int main(int argc, char **argv) {
	void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
	normalize_fn f = (normalize_fn) dlsym(h, "reft_go_normalize");
	if (!f) { printf("dlsym: %s\n", dlerror()); return 1; }
	char out[256] = "", err[256] = "";
	int rc = f("aec+arc", out, sizeof out, err, sizeof err);
	printf("%d %s%s\n", rc, out, err);
	return 0;
}
`
	if err := os.WriteFile(src, []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "load")
	if b, err := exec.Command("cc", "-o", bin, src, "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, b)
	}
	b, err := exec.Command(bin, filepath.Join(dir, "libreft_spank.so")).CombinedOutput()
	if err != nil || strings.TrimSpace(string(b)) != "0 arc+aec" {
		t.Fatalf("calling reft_go_normalize: %v, %q; want \"0 arc+aec\"", err, b)
	}
}
