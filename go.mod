module github.com/nexar-go/nexar

go 1.26.8

require (
	github.com/fxamacker/cbor/v2 v2.10.0
	github.com/hashicorp/golang-lru/v2 v2.0.7
	github.com/klauspost/reedsolomon v1.14.2
	github.com/quic-go/quic-go v0.65.0
	github.com/x448/float16 v0.8.4
	golang.org/x/sys v0.47.0
)

require (
	github.com/klauspost/cpuid/v2 v2.3.0 // indirect
	golang.org/x/crypto v0.54.0 // indirect
	golang.org/x/net v0.56.0 // indirect
)
