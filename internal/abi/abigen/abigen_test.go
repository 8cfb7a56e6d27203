package abigen

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nexar-go/nexar/internal/abi"
)

const root = "../../.."

// TestNoDrift fails when a generated copy (nexar.h's enums, _abi.py, the
// C++ traits, the version lines) differs from internal/abi.
func TestNoDrift(t *testing.T) {
	for _, err := range Check(root) {
		t.Error(err)
	}
}

// TestCheckFindsDrift edits each output in a scratch copy of the tree and
// expects Check to notice.
func TestCheckFindsDrift(t *testing.T) {
	edits := map[string][2]string{
		"include/nexar.h":                      {"NEXAR_ERR_MISMATCH = 3", "NEXAR_ERR_MISMATCH = 4"},
		"capi/abi_gen.h":                       {"case NEXAR_ERR_AUTH:", "case NEXAR_ERR_TIMEOUT:"},
		"capi/entry.c":                         {`GUARD("seed")`, "GUARD(NULL)"},
		"bindings/python/nexar/_abi.py":        {"FLOAT32 = 8", "FLOAT32 = 9"},
		"bindings/cpp/include/nexar/nexar.hpp": {"(double, NEXAR_FLOAT64)", "(double, NEXAR_FLOAT32)"},
		"CMakeLists.txt":                       {"VERSION " + abi.Version + " ", "VERSION 9.9.9 "},
		"pyproject.toml":                       {`version = "` + abi.Version + `"`, `version = "9.9.9"`},
	}
	if len(edits) != len(Files()) {
		t.Fatalf("%d edits for %d generated files: cover every file", len(edits), len(Files()))
	}
	for _, f := range Files() {
		t.Run(f.Path, func(t *testing.T) {
			tmp := t.TempDir()
			for _, g := range Files() {
				b, err := os.ReadFile(filepath.Join(root, g.Path))
				if err != nil {
					t.Fatal(err)
				}
				if g.Path == f.Path {
					e := edits[f.Path]
					if !strings.Contains(string(b), e[0]) {
						t.Fatalf("%s has no %q to edit", g.Path, e[0])
					}
					b = []byte(strings.Replace(string(b), e[0], e[1], 1))
				}
				p := filepath.Join(tmp, g.Path)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			errs := Check(tmp)
			if len(errs) != 1 || !strings.Contains(errs[0].Error(), f.Path) {
				t.Fatalf("Check after editing %s = %v, want one error naming it", f.Path, errs)
			}
			if _, err := Generate(tmp); err != nil {
				t.Fatal(err)
			}
			if errs := Check(tmp); len(errs) != 0 {
				t.Fatalf("Check after Generate = %v", errs)
			}
		})
	}
}

// TestTables checks the tables themselves: values 0..n-1 in order, unique
// names, and the version string agreeing with its numbers.
func TestTables(t *testing.T) {
	if v := fmt.Sprintf("%d.%d.%d", abi.VersionMajor, abi.VersionMinor, abi.VersionPatch); v != abi.Version {
		t.Errorf("Version %q, numbers say %q", abi.Version, v)
	}
	names := map[string]bool{}
	check := func(kind string, i, value int, cname string) {
		if value != i {
			t.Errorf("%s %s: value %d at index %d", kind, cname, value, i)
		}
		if names[cname] {
			t.Errorf("%s %s: duplicate name", kind, cname)
		}
		names[cname] = true
	}
	rs := abi.Results()
	for i, r := range rs {
		check("result", i, r.Value, r.CName)
		if i > 0 && r.PyClass == "" {
			t.Errorf("result %s has no Python class", r.CName)
		}
	}
	if len(rs) != abi.NumResults {
		t.Errorf("%d results, NumResults = %d", len(rs), abi.NumResults)
	}
	ds := abi.DTypes()
	for i, d := range ds {
		check("dtype", i, d.Value, d.CName)
		if d.Size <= 0 || d.CPPType == "" {
			t.Errorf("dtype %s: size %d, C++ type %q", d.CName, d.Size, d.CPPType)
		}
	}
	if len(ds) != abi.NumDTypes {
		t.Errorf("%d dtypes, NumDTypes = %d", len(ds), abi.NumDTypes)
	}
	ops := abi.Ops()
	for i, o := range ops {
		check("op", i, o.Value, o.CName)
	}
	if len(ops) != abi.NumOps {
		t.Errorf("%d ops, NumOps = %d", len(ops), abi.NumOps)
	}
}
