package main

// version is the one place the nexar version is written; `nexar info` and
// `nexar --version` print it.
const version = "0.1.0"
