package makefile

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestRaceBubblesOnOneP: every `go test -race` line of `make unit` that can
// run a test using testing/synctest runs it with -cpu 1, the Makefile's
// workaround for Go 1.26's race runtime sharing one tsan context per bubble
// between two threads (see the comment above RACE_PKGS).
func TestRaceBubblesOnOneP(t *testing.T) {
	out, err := runMake(t, "-n", "unit")
	if err != nil {
		t.Fatalf("make -n unit: %v\n%s", err, out)
	}
	root := repoRoot(t)
	lines := 0
	for line := range strings.SplitSeq(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.HasSuffix(f[0], "go") || f[1] != "test" || !strings.Contains(line, " -race") {
			continue
		}
		lines++
		run, cpu1, pkgs := raceLine(t, f[2:])
		if cpu1 {
			continue
		}
		for _, p := range pkgs {
			for _, name := range bubbleTests(t, filepath.Join(root, p)) {
				if run == nil || run.MatchString(name) {
					t.Errorf("make unit runs %s's %s under -race without -cpu 1, and it starts a synctest bubble: run it with -cpu 1, as RACE_BUBBLE_PKGS does\n%s", p, name, line)
				}
			}
		}
	}
	if lines == 0 {
		t.Fatalf("make -n unit printed no `go test -race` line; the check has nothing to check:\n%s", out)
	}
}

// raceLine reads a go test line's arguments: its -run pattern (nil: every
// test), whether it sets -cpu 1, and its package directories.
func raceLine(t *testing.T, args []string) (run *regexp.Regexp, cpu1 bool, pkgs []string) {
	t.Helper()
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-run" && i+1 < len(args):
			i++
			pat := strings.Trim(args[i], "'")
			re, err := regexp.Compile(pat)
			if err != nil {
				t.Fatalf("make unit's -run %q: %v", pat, err)
			}
			run = re
		case a == "-cpu" && i+1 < len(args):
			i++
			cpu1 = args[i] == "1"
		case strings.HasPrefix(a, "./"):
			pkgs = append(pkgs, a)
		}
	}
	return run, cpu1, pkgs
}

// bubbleTests names the Test functions in dir's test files whose bodies
// start a synctest bubble (call testing/synctest's Test or Run).
func bubbleTests(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files in %s (%v): the Makefile names a package without tests", dir, err)
	}
	var names []string
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatalf("parse %s: %v", name, err)
		}
		local := ""
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == "testing/synctest" {
				local = "synctest"
				if imp.Name != nil {
					local = imp.Name.Name
				}
			}
		}
		if local == "" {
			continue
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || fn.Body == nil || !strings.HasPrefix(fn.Name.Name, "Test") {
				continue
			}
			bubbled := false
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok {
					if x, ok := sel.X.(*ast.Ident); ok && x.Name == local && (sel.Sel.Name == "Test" || sel.Sel.Name == "Run") {
						bubbled = true
					}
				}
				return !bubbled
			})
			if bubbled {
				names = append(names, fn.Name.Name)
			}
		}
	}
	return names
}
