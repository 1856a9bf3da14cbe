# The two commands: `make run` and `make test`. See README.md.
SHELL := /bin/bash
GO ?= go
GOBIN := $(shell $(GO) env GOPATH)/bin
STATICCHECK_VERSION := v0.8.2
BENCHSTAT_VERSION := v0.0.0-20260908200009-22c9c6c9d4da

.PHONY: all build run test lint vet fmt-check unit bench bench-go bench-authz bench-core bench-core-overload bench-cluster proto clean

all: build

build:
	$(GO) build -o bin/sidecar ./sidecar/cmd/sidecar
	$(GO) build -o bin/core ./core/cmd/core
	$(GO) build -o bin/bench ./bench/cmd/bench
	$(GO) build -o bin/devstack ./deploy/cmd/devstack

# A throwaway PostgreSQL under ./.data (unless DATABASE_URL is set), migrations, dev keys,
# a demo tenant and echo channel, the sidecar (:8081/:8082) and the core (:8080, its
# metrics and health on :8083, with AUTHZ_ADDR) in the foreground. Ctrl-C stops everything.
run: build
	./bin/devstack

# Everything CI runs: formatting, vet, staticcheck, and every test (real PostgreSQL,
# real gRPC, the built binaries).
test: lint unit

lint: fmt-check vet
	@test -x $(GOBIN)/staticcheck || $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	$(GOBIN)/staticcheck ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

unit:
	$(GO) test -race -count=1 -timeout 10m ./...

# Benchmarks: the limiter hot path (Go benchmarks, compare runs with benchstat), the
# authorization load test against a no-op server in the same run, the core's activity
# POSTs against pgx inserting the same rows directly, the core's capacity and its
# recovery from an overload, and the cluster's overshoot and traffic against the sync
# interval (about 15 minutes).
bench: bench-go bench-authz bench-core bench-core-overload bench-cluster

bench-go:
	$(GO) test -run '^$$' -bench . -benchmem -count 6 ./sidecar/limiter/ | tee bench/results/limiter.txt
	@test -x $(GOBIN)/benchstat || $(GO) install golang.org/x/perf/cmd/benchstat@$(BENCHSTAT_VERSION)
	$(GOBIN)/benchstat bench/results/limiter.txt

bench-authz: build
	./bin/bench authz

bench-core: build
	./bin/bench core

bench-core-overload: build
	./bin/bench core-overload

bench-cluster: build
	./bin/bench cluster

proto:
	cd shared/limiterpb && protoc -I . --go_out=paths=source_relative:. --go-grpc_out=paths=source_relative:. limiter.proto

clean:
	rm -rf bin
