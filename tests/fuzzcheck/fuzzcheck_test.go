// Package fuzzcheck keeps the fuzz targets and their documentation
// honest: docs/security-fuzz.md lists every Go fuzz target of the module
// and nothing else, and every package whose code decodes input (JSON, a
// line scanner, a command's output) has a target or a stated reason why
// not. tests/fuzz.sh runs whatever targets exist.
package fuzzcheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
)

// noTarget are the decoding packages without a fuzz target, and why.
var noTarget = map[string]string{
	"agent/logging/logtest":   "a test helper reading the test's own log",
	"agent/sg/explain":        "`reft explain --map` reads a file its own user names, in the user's own process: no boundary",
	"tests/conformance-agent": "a test tool",
	"hostmem":                 "reads only what the kernel writes (/proc/self/cgroup, the cgroup files' limits, /proc/meminfo)",
}

var (
	fuzzFunc   = regexp.MustCompile(`(?m)^func (Fuzz\w*)\(f \*testing\.F\)`)
	pkgClause  = regexp.MustCompile(`(?m)^package (\w+)`)
	decodes    = regexp.MustCompile(`json\.(Unmarshal|NewDecoder)\(|\.Unmarshal\(|bufio\.NewScanner\(|exec\.Command(Context)?\(`)
	docTarget  = regexp.MustCompile("`(\\w+)\\.(Fuzz\\w*)`")
	skipDirs   = []string{".git", "build", "client/python", "docs", "etc"}
	tableStart = "| Input"
)

func repoRoot(t *testing.T) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot find the test's source path")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// scan returns the fuzz targets ("pkg.FuzzX", pkg the package's name) and
// the directories (relative to root) whose non-test code decodes input.
func scan(t *testing.T, root string) (targets map[string]string, decoders map[string]bool) {
	targets, decoders = map[string]string{}, map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if slices.Contains(skipDirs, rel) || strings.HasPrefix(d.Name(), ".") && rel != "." {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		dir := filepath.Dir(rel)
		if !strings.HasSuffix(path, "_test.go") {
			if decodes.Match(b) {
				decoders[dir] = true
			}
			return nil
		}
		pkg := pkgClause.FindSubmatch(b)
		if pkg == nil {
			return nil
		}
		name := strings.TrimSuffix(string(pkg[1]), "_test")
		for _, m := range fuzzFunc.FindAllSubmatch(b, -1) {
			targets[name+"."+string(m[1])] = dir
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return targets, decoders
}

func TestDocListsEveryTarget(t *testing.T) {
	root := repoRoot(t)
	targets, _ := scan(t, root)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "security-fuzz.md"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "|") || strings.HasPrefix(line, tableStart) || len(cells) < 4 {
			continue
		}
		for _, m := range docTarget.FindAllStringSubmatch(cells[3], -1) {
			listed[m[1]+"."+m[2]] = true
		}
	}
	var missing, stale []string
	for tg := range targets {
		if !listed[tg] {
			missing = append(missing, tg+" ("+targets[tg]+")")
		}
	}
	for tg := range listed {
		if _, ok := targets[tg]; !ok {
			stale = append(stale, tg)
		}
	}
	sort.Strings(missing)
	sort.Strings(stale)
	if len(missing) > 0 {
		t.Errorf("fuzz targets not in docs/security-fuzz.md's table (add a row: input, decoder, target, properties): %v", missing)
	}
	if len(stale) > 0 {
		t.Errorf("docs/security-fuzz.md lists targets that do not exist: %v", stale)
	}
	if len(targets) == 0 {
		t.Error("no fuzz targets found at all")
	}
}

func TestEveryDecoderHasATarget(t *testing.T) {
	root := repoRoot(t)
	targets, decoders := scan(t, root)
	has := map[string]bool{}
	for _, dir := range targets {
		has[dir] = true
	}
	var bare []string
	for dir := range decoders {
		if !has[dir] && noTarget[dir] == "" {
			bare = append(bare, dir)
		}
	}
	sort.Strings(bare)
	if len(bare) > 0 {
		t.Errorf("packages that decode input (JSON, a scanner, a command's output) without a fuzz target: %v; "+
			"add a Fuzz target (see docs/security-fuzz.md), or a reason to noTarget in tests/fuzzcheck", bare)
	}
	for dir, why := range noTarget {
		if !decoders[dir] {
			t.Errorf("noTarget lists %s (%s), which no longer decodes input: remove it", dir, why)
		}
	}
}
