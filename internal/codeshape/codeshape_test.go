package codeshape

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fzipp/gocyclo"
)

// root is the tree the limits hold for, from this package's directory.
const root = "../../agent"

// known reads testdata/known.txt: "<measure> <kind> <name>" per line,
// kind "func" or "methods", "#" comments.
func known(t *testing.T) map[string]int {
	t.Helper()
	f, err := os.Open("testdata/known.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		v, rest, ok := strings.Cut(line, " ")
		m, err := strconv.Atoi(v)
		if !ok || err != nil {
			t.Fatalf("testdata/known.txt:%d: %q is not \"<measure> <kind> <name>\"", n, line)
		}
		out[rest] = m
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// rel is a file's directory relative to the module root ("agent/peer").
func rel(t *testing.T, file string) string {
	r, err := filepath.Rel("../..", filepath.Dir(file))
	if err != nil {
		t.Fatal(err)
	}
	return filepath.ToSlash(r)
}

// ratchet compares the measures over limit with the known list's entries
// of kind: what is new or grew fails, and so does an entry that is now
// smaller than listed (lower it) or gone under the limit (remove it).
func ratchet(t *testing.T, kind string, limit int, got map[string]int) {
	t.Helper()
	list := known(t)
	for name, m := range got {
		key := kind + " " + name
		was, listed := list[key]
		switch {
		case !listed:
			t.Errorf("%s: %d, above %d: split it into steps that say what they do (or, for a type, along its seams)", key, m, limit)
		case m > was:
			t.Errorf("%s: %d, up from %d in testdata/known.txt: it may only shrink", key, m, was)
		case m < was:
			t.Errorf("%s: %d, down from %d: lower its entry in testdata/known.txt to %d", key, m, was, m)
		}
	}
	for key, was := range list {
		name, ok := strings.CutPrefix(key, kind+" ")
		if !ok {
			continue
		}
		if _, over := got[name]; !over {
			t.Errorf("%s (listed at %d) is at or under %d now: remove its entry from testdata/known.txt", key, was, limit)
		}
	}
}

// TestAgentComplexity: no function of agent/ above MaxComplexity but the
// known ones, which only shrink.
func TestAgentComplexity(t *testing.T) {
	stats := gocyclo.Analyze([]string{root}, regexp.MustCompile(`_test\.go$`))
	if len(stats) < 100 {
		t.Fatalf("gocyclo found %d functions under %s: the path is wrong", len(stats), root)
	}
	got := map[string]int{}
	for _, s := range stats {
		if s.Complexity > MaxComplexity {
			got[rel(t, s.Pos.Filename)+" "+s.FuncName] = s.Complexity
		}
	}
	ratchet(t, "func", MaxComplexity, got)
}

// methods counts the methods of each named type in the non-test files of
// agent/, by "<dir>.<type>".
func methods(t *testing.T) map[string]int {
	t.Helper()
	counts := map[string]int{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Recv == nil || len(fd.Recv.List) == 0 {
				continue
			}
			counts[rel(t, p)+"."+recvName(fd.Recv.List[0].Type)]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return counts
}

// recvName is the receiver's type name, without pointer or type
// parameters.
func recvName(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return fmt.Sprintf("%T", e)
		}
	}
}

// TestAgentMethods: no type of agent/ with more than MaxMethods methods
// but the known ones, which only shrink.
func TestAgentMethods(t *testing.T) {
	counts := methods(t)
	if counts["agent/localsrv.Server"] == 0 {
		t.Fatalf("no methods of agent/localsrv.Server counted: the walk is wrong (%d types)", len(counts))
	}
	got := map[string]int{}
	for name, n := range counts {
		if n > MaxMethods {
			got[name] = n
		}
	}
	ratchet(t, "methods", MaxMethods, got)
}

// TestRecvName: the receiver forms Go has.
func TestRecvName(t *testing.T) {
	src := `package p
func (s *S) a() {}
func (s S) b() {}
func (g *G[T]) c() {}
func (m M[K, V]) d() {}
func (*U) e() {}`
	f, err := parser.ParseFile(token.NewFileSet(), "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range f.Decls {
		got = append(got, recvName(d.(*ast.FuncDecl).Recv.List[0].Type))
	}
	if want := []string{"S", "S", "G", "M", "U"}; !slices.Equal(got, want) {
		t.Errorf("receivers %v, want %v", got, want)
	}
}
