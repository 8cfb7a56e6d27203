// Package ccbuild compiles the C fakes of tests/fakes (stand-ins for
// hardware libraries) into shared libraries, for tests that load them.
package ccbuild

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// Source is the path of file in the src directory of the package that
// calls it (a tests/fakes package).
func Source(file string) (string, error) {
	_, caller, _, ok := runtime.Caller(1)
	if !ok {
		return "", fmt.Errorf("fakes: cannot locate the source directory of %s", file)
	}
	return filepath.Join(filepath.Dir(caller), "src", file), nil
}

// Shared compiles src into out, a shared library, with $CC (default cc),
// warnings as errors, linking libs ("-lpthread", ...).
func Shared(src, out string, libs ...string) error {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	args := append([]string{"-std=c11", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o", out, src}, libs...)
	cmd := exec.Command(cc, args...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("fakes: %s: %v\n%s", cmd, err, b)
	}
	return nil
}

// Cached returns the path of src compiled (Shared) under the temporary
// directory, named after a hash of the source, the compiler and libs, and
// compiles it only when that file is missing: the test binaries of one
// `go test ./...` share one build, and a library a process has loaded is
// never rewritten (a changed source gets a new name).
func Cached(src, name string, libs ...string) (string, error) {
	code, err := os.ReadFile(src)
	if err != nil {
		return "", fmt.Errorf("fakes: %w", err)
	}
	h := sha256.New()
	h.Write(code)
	fmt.Fprint(h, os.Getenv("CC"), libs)
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("nexar-fakes-%d", os.Getuid()))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("fakes: %w", err)
	}
	out := filepath.Join(dir, name+"-"+hex.EncodeToString(h.Sum(nil)[:8])+".so")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	tmp, err := os.CreateTemp(dir, name+"-*.tmp")
	if err != nil {
		return "", fmt.Errorf("fakes: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	if err := Shared(src, tmp.Name(), libs...); err != nil {
		return "", err
	}
	// Atomic: a concurrent build by another test binary renames the same
	// bytes over it.
	return out, os.Rename(tmp.Name(), out)
}
