// Command gen writes the generated copies of internal/abi's tables (run by
// `go generate ./internal/abi`, from the internal/abi directory).
package main

import (
	"fmt"
	"os"

	"github.com/nexar-go/nexar/internal/abi/abigen"
)

func main() {
	wrote, err := abigen.Generate("../..")
	for _, p := range wrote {
		fmt.Println("abigen: wrote", p)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
