package main

import "github.com/nexar-go/nexar/internal/abi"

// version is what `nexar info` and `nexar --version` print; internal/abi
// is its one source.
const version = abi.Version
