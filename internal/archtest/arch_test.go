// Package archtest keeps docs/architecture.md's map true: its package table
// against `go list`, and the dependency rules the layers keep.
package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/nexar-go/nexar"

// unmapped are the packages the table leaves out on purpose: programs that
// measure, show or drive the library rather than parts of it ("x/..." is x
// and every package below it).
var unmapped = []string{"bench/...", "examples/...", "tests/multiproc/...", "tests/netns", "internal/abi/abigen", "internal/abi/gen"}

// A rule forbids imports: from a package matching from, of a package
// matching to. Direct rules look at a package's own imports; the others at
// everything it depends on. "x/..." is x and every package below it,
// "x/*" only the packages below it.
type rule struct {
	from, to string
	deps     bool
	why      string
}

var rules = []rule{
	{"hw/...", "collective", true, "the hardware bindings sit below the algorithms (dtypes and ops: internal/dtype)"},
	{"hier", "transport/*", false, "hier reaches the transports through core only (the host id: internal/hostid)"},
	{"core", "transport/*", false, "core drives a transport.DataPath and names no concrete transport"},
}

// exceptions are edges a rule forbids that the code still has, each said
// in the log of every run until it is gone (and then must leave this list).
// None: core's five edges to the concrete transports went with the mesh
// builder (transport/mesh).
var exceptions = []string{}

type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
	GoFiles    []string
}

func (p pkg) rel(paths []string) []string {
	var out []string
	for _, q := range paths {
		if r, ok := strings.CutPrefix(q, module+"/"); ok {
			out = append(out, r)
		}
	}
	return out
}

// goList returns the module's packages by path relative to the module and
// the module's root directory.
func goList(t *testing.T) (map[string]pkg, string) {
	t.Helper()
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	dir := strings.TrimSpace(string(root))
	cmd := exec.Command("go", "list", "-e", "-deps=false", "-json=ImportPath,Imports,Deps,GoFiles", "./...")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./...: %v\n%s", err, stderr.String())
	}
	pkgs := map[string]pkg{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if r, ok := strings.CutPrefix(p.ImportPath, module+"/"); ok && len(p.GoFiles) > 0 {
			pkgs[r] = p
		}
	}
	return pkgs, dir
}

// match reports whether path matches pattern (see rule).
func match(pattern, path string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	if base, ok := strings.CutSuffix(pattern, "/*"); ok {
		return strings.HasPrefix(path, base+"/")
	}
	return path == pattern
}

// row is one line of the package table: the package and its import column.
type row struct {
	line    int
	pkg     string
	imports string
}

var backticked = regexp.MustCompile("`([^`]+)`")

// table parses the package table of architecture.md: the first cell names
// one package in backticks, the last lists the packages of this module it
// imports directly ("—" for none).
func table(t *testing.T, doc []byte) []row {
	t.Helper()
	var rows []row
	in := false
	for i, l := range strings.Split(string(doc), "\n") {
		switch {
		case strings.HasPrefix(l, "## "):
			in = l == "## Packages"
			continue
		case !in || !strings.HasPrefix(l, "|"):
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		if len(cells) != 3 {
			t.Errorf("architecture.md:%d: a table row has %d cells, want 3 (package, one job, imports)", i+1, len(cells))
			continue
		}
		first := strings.TrimSpace(cells[0])
		if first == "package" || strings.HasPrefix(first, "---") {
			continue
		}
		names := backticked.FindAllStringSubmatch(first, -1)
		if len(names) != 1 {
			t.Errorf("architecture.md:%d: the first cell %q must name one package in backticks", i+1, first)
			continue
		}
		rows = append(rows, row{i + 1, names[0][1], strings.TrimSpace(cells[2])})
	}
	if len(rows) == 0 {
		t.Fatal("architecture.md: no package table under \"## Packages\"")
	}
	return rows
}

// TestMap checks the import column of docs/architecture.md against the
// code: for every package of the module, the packages of this module its
// non-test files import, exactly (test-only imports are not the map's).
// Every package has a row unless listed in unmapped; a row for something
// that is not a Go package (the bindings) says "C ABI only".
func TestMap(t *testing.T) {
	pkgs, root := goList(t)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range table(t, doc) {
		if seen[r.pkg] {
			t.Errorf("architecture.md:%d: %s has a second row", r.line, r.pkg)
		}
		seen[r.pkg] = true
		p, ok := pkgs[r.pkg]
		if !ok {
			if r.imports != "C ABI only" {
				t.Errorf("architecture.md:%d: %s is not a package of the module (a row for the bindings says \"C ABI only\")", r.line, r.pkg)
			}
			continue
		}
		var doc []string
		if r.imports != "—" {
			for _, s := range strings.Split(r.imports, ",") {
				doc = append(doc, strings.TrimSpace(s))
			}
		}
		code := p.rel(p.Imports)
		slices.Sort(doc)
		slices.Sort(code)
		if !slices.Equal(doc, code) {
			want := strings.Join(code, ", ")
			if want == "" {
				want = "—"
			}
			t.Errorf("architecture.md:%d: %s's import column says %q; the code imports %q", r.line, r.pkg, r.imports, want)
		}
	}
	for _, path := range slices.Sorted(maps.Keys(pkgs)) {
		if !seen[path] && !slices.ContainsFunc(unmapped, func(u string) bool { return match(u, path) }) {
			t.Errorf("architecture.md: package %s has no row in the package table (or add it to archtest's unmapped)", path)
		}
	}
}

// TestRules fails on an import a rule forbids, unless it is a listed
// exception, which is logged on every run; an exception the code no longer
// has must leave the list.
func TestRules(t *testing.T) {
	pkgs, _ := goList(t)
	found := map[string]bool{}
	for _, path := range slices.Sorted(maps.Keys(pkgs)) {
		p := pkgs[path]
		for _, r := range rules {
			if !match(r.from, path) {
				continue
			}
			imports := p.Imports
			if r.deps {
				imports = p.Deps
			}
			for _, q := range p.rel(imports) {
				if !match(r.to, q) {
					continue
				}
				edge := path + " -> " + q
				if slices.Contains(exceptions, edge) {
					found[edge] = true
					t.Logf("known exception: %s (%s -> %s is forbidden: %s)", edge, r.from, r.to, r.why)
					continue
				}
				how := "imports"
				if r.deps {
					how = "depends on"
				}
				t.Errorf("%s %s %s: forbidden (%s -> %s: %s)", path, how, q, r.from, r.to, r.why)
			}
		}
	}
	for _, e := range exceptions {
		if !found[e] {
			t.Errorf("exception %q no longer holds in the code: remove it from archtest's exceptions", e)
		}
	}
}
