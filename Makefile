# Minimal bootstrap Makefile; the full one (deps, lib, demo, ctest, pytest) replaces it.
GO ?= go
.PHONY: test demo build
build:
	$(GO) build ./...
test: build
	$(GO) vet ./...
	$(GO) test -race ./...
demo: build
	@echo "demo: not yet available"
