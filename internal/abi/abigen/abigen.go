// Package abigen renders the copies of internal/abi's tables that other
// languages need, and checks them. Each target is either a whole generated
// file or a marked region of a hand-written one:
//
//	<comment> @generated NAME: go generate ./internal/abi
//	...generated lines...
//	<comment> @end NAME
//
// where <comment> is the file's comment leader ("/*", "//", "#").
package abigen

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/nexar-go/nexar/internal/abi"
)

// File is one generated output: its path relative to the repository root,
// and how to make its new content from its current content (nil for a
// file that does not exist yet).
type File struct {
	Path   string
	Render func(old []byte) ([]byte, error)
}

// Files lists every generated output.
func Files() []File {
	return []File{
		{"include/nexar.h", chain(regions(cRegions()), prototypes)},
		{"capi/abi_gen.h", whole(cResultStrings)},
		{"capi/entry.c", func(old []byte) ([]byte, error) {
			shims, err := entryShims()
			if err != nil {
				return nil, err
			}
			return regions(map[string]string{"entry": shims})(old)
		}},
		{"bindings/python/nexar/_abi.py", whole(pythonTables)},
		{"bindings/cpp/include/nexar/nexar.hpp", regions(map[string]string{"datatype_of": cppTraits()})},
		{"CMakeLists.txt", replaceLine(`(?m)^project\(nexar VERSION [0-9.]+ `, "project(nexar VERSION "+abi.Version+" ")},
		{"pyproject.toml", replaceLine(`(?m)^version = "[0-9.]+"$`, `version = "`+abi.Version+`"`)},
	}
}

// Generate rewrites every output under root that differs from what the
// tables produce and returns the paths it wrote.
func Generate(root string) ([]string, error) {
	var wrote []string
	for _, f := range Files() {
		p := filepath.Join(root, f.Path)
		old, err := os.ReadFile(p)
		if err != nil && !os.IsNotExist(err) {
			return wrote, err
		}
		got, err := f.Render(old)
		if err != nil {
			return wrote, fmt.Errorf("abigen: %s: %w", f.Path, err)
		}
		if bytes.Equal(old, got) {
			continue
		}
		if err := os.WriteFile(p, got, 0o644); err != nil {
			return wrote, err
		}
		wrote = append(wrote, f.Path)
	}
	return wrote, nil
}

// Check returns one error per output under root that differs from what the
// tables produce (drift: someone edited a copy, or the tables, without
// running go generate ./internal/abi).
func Check(root string) []error {
	var errs []error
	for _, f := range Files() {
		old, err := os.ReadFile(filepath.Join(root, f.Path))
		if err != nil {
			errs = append(errs, fmt.Errorf("abigen: %s: %w", f.Path, err))
			continue
		}
		got, err := f.Render(old)
		if err != nil {
			errs = append(errs, fmt.Errorf("abigen: %s: %w", f.Path, err))
			continue
		}
		if !bytes.Equal(old, got) {
			errs = append(errs, fmt.Errorf("abigen: %s differs from internal/abi; run go generate ./internal/abi", f.Path))
		}
	}
	return errs
}

const genNote = "go generate ./internal/abi"

func whole(body func() string) func([]byte) ([]byte, error) {
	return func([]byte) ([]byte, error) { return []byte(body()), nil }
}

func replaceLine(pattern, with string) func([]byte) ([]byte, error) {
	re := regexp.MustCompile(pattern)
	return func(old []byte) ([]byte, error) {
		if n := len(re.FindAllIndex(old, -1)); n != 1 {
			return nil, fmt.Errorf("want one line matching %s, found %d", pattern, n)
		}
		return re.ReplaceAllLiteral(old, []byte(with)), nil
	}
}

var markerRE = regexp.MustCompile(`(?m)^([ \t]*)(/\*|//|#) @generated ([a-z_]+): .*$`)

// regions replaces the body of every marked region with bodies[name]; every
// region must be known and every body used exactly once.
func regions(bodies map[string]string) func([]byte) ([]byte, error) {
	return func(old []byte) ([]byte, error) {
		var out bytes.Buffer
		used := map[string]bool{}
		rest := old
		for {
			m := markerRE.FindSubmatchIndex(rest)
			if m == nil {
				out.Write(rest)
				break
			}
			leader, name := string(rest[m[4]:m[5]]), string(rest[m[6]:m[7]])
			body, ok := bodies[name]
			if !ok {
				return nil, fmt.Errorf("unknown generated region %q", name)
			}
			if used[name] {
				return nil, fmt.Errorf("generated region %q appears twice", name)
			}
			used[name] = true
			end := leader + " @end " + name
			lineEnd := m[1]
			stop := bytes.Index(rest[lineEnd:], []byte(end))
			if stop < 0 {
				return nil, fmt.Errorf("generated region %q has no %q", name, end)
			}
			out.Write(rest[:m[0]])
			out.WriteString(closeComment(leader, fmt.Sprintf("%s @generated %s: %s", leader, name, genNote)))
			out.WriteString("\n")
			out.WriteString(body)
			rest = rest[lineEnd+stop:]
		}
		for name := range bodies {
			if !used[name] {
				return nil, fmt.Errorf("generated region %q is missing", name)
			}
		}
		return out.Bytes(), nil
	}
}

func closeComment(leader, s string) string {
	if leader == "/*" {
		return s + " */"
	}
	return s
}

func cRegions() map[string]string {
	var v strings.Builder
	fmt.Fprintf(&v, "#define NEXAR_VERSION_MAJOR %d\n", abi.VersionMajor)
	fmt.Fprintf(&v, "#define NEXAR_VERSION_MINOR %d\n", abi.VersionMinor)
	fmt.Fprintf(&v, "#define NEXAR_VERSION_PATCH %d\n", abi.VersionPatch)

	var r []enumItem
	for _, x := range abi.Results() {
		r = append(r, enumItem{x.CName, x.Value, x.Doc})
	}
	var d []enumItem
	for _, x := range abi.DTypes() {
		d = append(d, enumItem{x.CName, x.Value, x.Doc})
	}
	var o []enumItem
	for _, x := range abi.Ops() {
		o = append(o, enumItem{x.CName, x.Value, x.Doc})
	}
	return map[string]string{
		"version":  v.String(),
		"result":   cEnum("nexar_result", "nexar_result_t", r),
		"datatype": cEnum("nexar_datatype", "nexar_datatype_t", d),
		"op":       cEnum("nexar_op", "nexar_op_t", o),
	}
}

type enumItem struct {
	name  string
	value int
	doc   string
}

// cEnum lays out an enum as clang-format would: comments aligned one
// column after the longest "NAME = V," of the items that have one.
func cEnum(tag, typedef string, items []enumItem) string {
	width := 0
	for i, it := range items {
		if it.doc != "" {
			width = max(width, len(enumDecl(it, i == len(items)-1)))
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "typedef enum %s {\n", tag)
	for i, it := range items {
		decl := enumDecl(it, i == len(items)-1)
		if it.doc == "" {
			fmt.Fprintf(&b, "    %s\n", decl)
			continue
		}
		fmt.Fprintf(&b, "    %-*s /* %s */\n", width, decl, it.doc)
	}
	fmt.Fprintf(&b, "} %s;\n", typedef)
	return b.String()
}

func enumDecl(it enumItem, last bool) string {
	s := fmt.Sprintf("%s = %d", it.name, it.value)
	if !last {
		s += ","
	}
	return s
}

func cResultStrings() string {
	var b strings.Builder
	b.WriteString("// @generated from internal/abi by " + genNote + ". Do not edit.\n")
	b.WriteString("// The messages of nexar_result_string (capi/lasterror.c).\n")
	b.WriteString("#ifndef NEXAR_CAPI_ABI_GEN_H\n#define NEXAR_CAPI_ABI_GEN_H\n\n#include \"nexar.h\"\n\n")
	b.WriteString("static const char* nxcapi_result_message(nexar_result_t code) {\n    switch (code) {\n")
	for _, r := range abi.Results() {
		fmt.Fprintf(&b, "    case %s:\n        return %q;\n", r.CName, r.Message)
	}
	b.WriteString("    }\n    return \"unknown result\";\n}\n\n#endif\n")
	return b.String()
}

func pythonTables() string {
	var b strings.Builder
	b.WriteString("# @generated from internal/abi by " + genNote + ". Do not edit.\n")
	b.WriteString(`"""The values of include/nexar.h's enums and the library version, generated
from the one Go source (internal/abi) so that no copy can drift."""

from __future__ import annotations

import enum

`)
	fmt.Fprintf(&b, "VERSION = %q\n\n", abi.Version)
	b.WriteString("\nclass Datatype(enum.IntEnum):\n    \"\"\"nexar_datatype_t.\"\"\"\n\n")
	for _, d := range abi.DTypes() {
		fmt.Fprintf(&b, "    %s = %d\n", strings.ToUpper(d.Name), d.Value)
	}
	b.WriteString("\n    @property\n    def itemsize(self) -> int:\n        return ITEMSIZE[self]\n")
	b.WriteString("\n    @property\n    def is_float(self) -> bool:\n        return self in FLOAT_TYPES\n\n")
	b.WriteString("\nclass Op(enum.IntEnum):\n    \"\"\"nexar_op_t.\"\"\"\n\n")
	for _, o := range abi.Ops() {
		fmt.Fprintf(&b, "    %s = %d\n", strings.ToUpper(o.Name), o.Value)
	}
	b.WriteString("\n\n# Bytes per element, by Datatype value.\nITEMSIZE = {")
	for i, d := range abi.DTypes() {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d: %d", d.Value, d.Size)
	}
	b.WriteString("}\n\n# Floating-point Datatype values.\nFLOAT_TYPES = frozenset({")
	first := true
	for _, d := range abi.DTypes() {
		if d.Float {
			if !first {
				b.WriteString(", ")
			}
			first = false
			fmt.Fprintf(&b, "%d", d.Value)
		}
	}
	b.WriteString("})\n\n# nexar_result_t: value -> (enumerator, exception class in _errors.py).\nRESULTS = {\n")
	for _, r := range abi.Results() {
		if r.Value == abi.Success {
			continue
		}
		fmt.Fprintf(&b, "    %d: (%q, %q),\n", r.Value, r.CName, r.PyClass)
	}
	b.WriteString("}\n")
	return b.String()
}

func cppTraits() string {
	var b strings.Builder
	for _, d := range abi.DTypes() {
		fmt.Fprintf(&b, "NEXAR_HPP_DATATYPE(%s, %s);\n", d.CPPType, d.CName)
	}
	return b.String()
}
