package abigen

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"

	"github.com/nexar-go/nexar/internal/abi"
)

// cFunc is one C function of a family of abi.Funcs.
type cFunc struct {
	name   string  // nexar_...
	params []param // in order
	guard  string  // a C string literal, or NULL
	goFn   string  // the Go export
	goArgs []string
}

type param struct{ ctype, name string }

// expand turns the description into the C functions, families expanded.
func expand() ([]cFunc, error) {
	var out []cFunc
	for _, f := range abi.Funcs() {
		ps, err := parseParams(f.Params)
		if err != nil {
			return nil, fmt.Errorf("nexar_%s: %w", f.Name, err)
		}
		forms := f.Forms
		if forms == 0 {
			forms = abi.Blocking
		}
		if forms&abi.Blocking != 0 {
			c, err := newCFunc("nexar_"+f.Name, ps, f)
			if err != nil {
				return nil, err
			}
			out = append(out, c)
		}
		if forms&abi.NonBlocking != 0 {
			c, err := newCFunc("nexar_i"+f.Name, append(ps[:len(ps):len(ps)], param{"nexar_request_t*", "req"}), f)
			if err != nil {
				return nil, err
			}
			out = append(out, c)
		}
		if forms&abi.Stream != 0 {
			c, err := newCFunc("nexar_"+f.Name+"_stream", append(ps[:len(ps):len(ps)], param{"void*", "stream"}), f)
			if err != nil {
				return nil, err
			}
			out = append(out, c)
		}
	}
	return out, nil
}

func newCFunc(name string, ps []param, f abi.Func) (cFunc, error) {
	c := cFunc{name: name, params: ps, goFn: "nxgo_" + strings.TrimPrefix(name, "nexar_")}
	if f.Go != "" {
		if name != "nexar_"+f.Name {
			return c, fmt.Errorf("%s: a Go call of its own is for a function of one form", name)
		}
		open := strings.IndexByte(f.Go, '(')
		if open < 0 || !strings.HasSuffix(f.Go, ")") {
			return c, fmt.Errorf("%s: Go call %q is not fn(args)", name, f.Go)
		}
		c.goFn = f.Go[:open]
		for _, a := range strings.Split(f.Go[open+1:len(f.Go)-1], ",") {
			c.goArgs = append(c.goArgs, strings.TrimSpace(a))
		}
	} else {
		for _, p := range ps {
			c.goArgs = append(c.goArgs, p.name)
		}
	}
	byName := map[string]param{}
	for _, p := range ps {
		byName[p.name] = p
	}
	for i, a := range c.goArgs {
		if p, ok := byName[a]; ok {
			cast, err := castOf(p.ctype)
			if err != nil {
				return c, fmt.Errorf("%s: parameter %s: %w", name, p.name, err)
			}
			c.goArgs[i] = cast + a
		}
	}
	c.guard = "NULL"
	if f.Guard != "" {
		c.guard = fmt.Sprintf("%q", f.Guard)
	} else {
		for _, p := range ps {
			if g, ok := handleKinds[p.ctype]; ok {
				c.guard = fmt.Sprintf("%q", g)
				break
			}
		}
	}
	return c, nil
}

// handleKinds names the handle types passed by value, for the refusal.
var handleKinds = map[string]string{
	"nexar_comm_t":    "communicator",
	"nexar_request_t": "request",
	"nexar_seed_t":    "seed",
}

// casts convert a C parameter to the type of the Go export's parameter
// (cgo sees handles and function pointers as uintptr_t, enums as int,
// structs and const pointers as plain pointers).
var casts = map[string]string{
	"nexar_comm_t": "(uintptr_t)", "nexar_request_t": "(uintptr_t)", "nexar_seed_t": "(uintptr_t)",
	"nexar_failure_fn": "(uintptr_t)", "nexar_rpc_handler_t": "(uintptr_t)",
	"nexar_rpc_lent_handler_t": "(uintptr_t)", "nexar_rpc_alloc_t": "(uintptr_t)",
	"nexar_comm_t*": "(uintptr_t*)", "nexar_request_t*": "(uintptr_t*)", "nexar_seed_t*": "(uintptr_t*)",
	"const void*": "(void*)", "const nexar_config_t*": "(void*)", "nexar_status_t*": "(void*)",
	"nexar_stats_t*": "(void*)", "const nexar_device_adapter_t*": "(void*)", "const void* const*": "(void*)", "void* const*": "(void*)",
	"const char*": "(char*)", "const size_t*": "(size_t*)",
	"nexar_result_t*": "(int*)", "nexar_failure_policy_t*": "(int*)",
	"nexar_failure_policy_t": "(int)", "nexar_compress_t": "(int)",
	// Passed as they are: the Go export's parameter has the same C type
	// (enums of the ABI convert implicitly to int).
	"nexar_datatype_t": "", "nexar_op_t": "",
}

func castOf(ctype string) (string, error) {
	if c, ok := casts[ctype]; ok {
		return c, nil
	}
	if strings.Contains(ctype, "nexar_") || strings.HasPrefix(ctype, "const ") {
		return "", fmt.Errorf("no conversion known for %q: add one to abigen's casts", ctype)
	}
	return "", nil
}

var paramRE = regexp.MustCompile(`^(.*[ *])([a-z_][a-z_0-9]*)$`)

func parseParams(s string) ([]param, error) {
	var ps []param
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		m := paramRE.FindStringSubmatch(f)
		if m == nil {
			return nil, fmt.Errorf("parameter %q is not \"type name\"", f)
		}
		ps = append(ps, param{strings.TrimSpace(m[1]), m[2]})
	}
	return ps, nil
}

func (c cFunc) paramList() []string {
	var s []string
	for _, p := range c.params {
		s = append(s, p.ctype+" "+p.name)
	}
	return s
}

// wrap lays out head + items joined by ", " + tail as clang-format does
// with a column limit of 100: items packed greedily, continuation lines
// aligned one column after head (which ends with the opening parenthesis)
// when alignTo is -1, else indented by alignTo spaces.
func wrap(head string, items []string, tail string, alignTo int) string {
	const limit = 100
	indent := len(head)
	if alignTo >= 0 {
		indent = alignTo
	}
	var b strings.Builder
	line := head
	for i, it := range items {
		piece := it
		if i < len(items)-1 {
			piece += ","
		} else {
			piece += tail
		}
		switch {
		case i == 0:
			line += piece
		case len(line)+1+len(piece) <= limit:
			line += " " + piece
		default:
			b.WriteString(line + "\n")
			line = strings.Repeat(" ", indent) + piece
		}
	}
	if len(items) == 0 {
		line += tail
	}
	b.WriteString(line)
	return b.String()
}

// prototype is the declaration nexar.h holds.
func (c cFunc) prototype() string {
	return wrap("nexar_result_t "+c.name+"(", c.paramList(), ");", -1)
}

// shim is the definition entry.c holds.
func (c cFunc) shim() string {
	var b strings.Builder
	b.WriteString(wrap("nexar_result_t "+c.name+"(", c.paramList(), ") {", -1))
	fmt.Fprintf(&b, "\n    GUARD(%s);\n", c.guard)
	b.WriteString(wrap("    return (nexar_result_t)"+c.goFn+"(", c.goArgs, ");", 8))
	b.WriteString("\n}\n")
	return b.String()
}

// entryShims is the generated region of capi/entry.c.
func entryShims() (string, error) {
	fs, err := expand()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for i, f := range fs {
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString(f.shim())
	}
	return b.String(), nil
}

// protoRE finds the declaration of a function in nexar.h: its return type
// at the start of a line, through the semicolon.
func protoRE(name string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^nexar_result_t ` + regexp.QuoteMeta(name) + `\([^;{]*\);`)
}

// anyProtoRE finds every function declaration of nexar.h.
var anyProtoRE = regexp.MustCompile(`(?m)^[a-z_][a-z_0-9 ]*\*? ?\*?(nexar_[a-z_0-9]+)\([^;{]*\);`)

// prototypes rewrites the declaration of every described function in
// nexar.h from the description; each must be declared exactly once, and
// nexar.h must declare no other function but abi.HandWritten.
func prototypes(old []byte) ([]byte, error) {
	fs, err := expand()
	if err != nil {
		return nil, err
	}
	known := map[string]bool{}
	for _, h := range abi.HandWritten {
		known[h] = true
	}
	for _, f := range fs {
		if known[f.name] {
			return nil, fmt.Errorf("%s is described twice", f.name)
		}
		known[f.name] = true
		re := protoRE(f.name)
		if n := len(re.FindAllIndex(old, -1)); n != 1 {
			return nil, fmt.Errorf("%s: want one declaration, found %d", f.name, n)
		}
		p := []byte(f.prototype())
		old = re.ReplaceAllFunc(old, func([]byte) []byte { return p })
	}
	for _, m := range anyProtoRE.FindAllSubmatch(old, -1) {
		if !known[string(m[1])] {
			return nil, fmt.Errorf("%s is declared but neither described in internal/abi (funcs.go) nor hand-written", m[1])
		}
	}
	return old, nil
}

// chain applies renders in order.
func chain(rs ...func([]byte) ([]byte, error)) func([]byte) ([]byte, error) {
	return func(old []byte) ([]byte, error) {
		cur := bytes.Clone(old)
		for _, r := range rs {
			var err error
			if cur, err = r(cur); err != nil {
				return nil, err
			}
		}
		return cur, nil
	}
}
