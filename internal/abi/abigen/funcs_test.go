package abigen

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestGoExports checks the description against capi's Go side: every C
// function has its Go export (//export nxgo_...) taking as many arguments
// as the shim passes, and every export is called by a shim or by
// hand-written C (callbacks.c, lasterror.c).
func TestGoExports(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, filepath.Join(root, "capi"), func(fi os.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	exports := map[string]int{} // name -> parameters
	for _, p := range pkgs {
		for _, f := range p.Files {
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Doc == nil {
					continue
				}
				for _, c := range fd.Doc.List {
					if strings.HasPrefix(c.Text, "//export ") {
						n := 0
						for _, fl := range fd.Type.Params.List {
							n += max(1, len(fl.Names))
						}
						exports[strings.TrimPrefix(c.Text, "//export ")] = n
					}
				}
			}
		}
	}
	fs, err := expand()
	if err != nil {
		t.Fatal(err)
	}
	called := map[string]bool{}
	for _, f := range fs {
		called[f.goFn] = true
		n, ok := exports[f.goFn]
		if !ok {
			t.Errorf("%s calls %s, which capi does not export", f.name, f.goFn)
			continue
		}
		if n != len(f.goArgs) {
			t.Errorf("%s passes %d arguments to %s, which takes %d", f.name, len(f.goArgs), f.goFn, n)
		}
	}
	for name := range exports {
		if !called[name] && strings.HasPrefix(name, "nxgo_") {
			t.Errorf("capi exports %s, which no function of internal/abi's description calls", name)
		}
	}
}

// TestFamilies checks the expansion of a family into its forms.
func TestFamilies(t *testing.T) {
	fs, err := expand()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]cFunc{}
	for _, f := range fs {
		if _, dup := got[f.name]; dup {
			t.Errorf("%s twice", f.name)
		}
		got[f.name] = f
	}
	ar, iar, sar := got["nexar_allreduce"], got["nexar_iallreduce"], got["nexar_allreduce_stream"]
	if len(iar.params) != len(ar.params)+1 || iar.params[len(iar.params)-1] != (param{"nexar_request_t*", "req"}) {
		t.Errorf("nexar_iallreduce's parameters: %v", iar.params)
	}
	if len(sar.params) != len(ar.params)+1 || sar.params[len(sar.params)-1] != (param{"void*", "stream"}) {
		t.Errorf("nexar_allreduce_stream's parameters: %v", sar.params)
	}
	want := "    return (nexar_result_t)nxgo_iallreduce((void*)sendbuf, recvbuf, count, dt, op, (uintptr_t)comm,\n        (uintptr_t*)req);\n"
	if s := iar.shim(); !strings.HasSuffix(s, want+"}\n") || !strings.Contains(s, `GUARD("communicator");`) {
		t.Errorf("nexar_iallreduce's shim:\n%s", s)
	}
	if g := got["nexar_comm_init"].guard; g != "NULL" {
		t.Errorf("nexar_comm_init's guard %s, want NULL", g)
	}
	if g := got["nexar_wait"].guard; g != `"request"` {
		t.Errorf("nexar_wait's guard %s", g)
	}
}

// TestPrototypesRefuseUnknown: a function nexar.h declares that the
// description lacks is an error, not silently left alone.
func TestPrototypesRefuseUnknown(t *testing.T) {
	h, err := os.ReadFile(filepath.Join(root, "include/nexar.h"))
	if err != nil {
		t.Fatal(err)
	}
	extra := append(h, []byte("\nnexar_result_t nexar_made_up(nexar_comm_t comm);\n")...)
	if _, err := prototypes(extra); err == nil || !strings.Contains(err.Error(), "nexar_made_up") {
		t.Errorf("prototypes with an undescribed function: %v", err)
	}
	missing := []byte(strings.Replace(string(h), "nexar_result_t nexar_barrier(nexar_comm_t comm);", "", 1))
	if _, err := prototypes(missing); err == nil || !strings.Contains(err.Error(), "nexar_barrier") {
		t.Errorf("prototypes without nexar_barrier's declaration: %v", err)
	}
}
