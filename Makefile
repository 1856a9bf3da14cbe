# The two commands: `make run` and `make test`. See README.md.
SHELL := /bin/bash
GO ?= go
GOBIN := $(shell $(GO) env GOPATH)/bin
STATICCHECK_VERSION := v0.8.2
BENCHSTAT_VERSION := v0.0.0-20260908200009-22c9c6c9d4da
# --version prints the VCS revision that go build records (an environment may turn that
# off with GOFLAGS=-buildvcs=false; auto records it wherever the checkout allows).
BUILDFLAGS ?= -buildvcs=auto
# Benchmarks write into a new folder per run; BENCH_OUT=bench/results updates the
# committed figures (and pass -update-results to bin/bench for the load tests).
# (Expanded once: a recipe that runs for minutes must write into one folder.)
ifeq ($(origin BENCH_OUT), undefined)
BENCH_OUT := bench/out/$(shell date -u +%Y%m%dT%H%M%SZ)-go
endif

.PHONY: all build run test lint vet fmt-check unit bench bench-go bench-rls-go bench-authz bench-forward-auth bench-rls bench-core bench-core-overload bench-cluster proto clean

all: build

build:
	$(GO) build $(BUILDFLAGS) -o bin/sidecar ./sidecar/cmd/sidecar
	$(GO) build $(BUILDFLAGS) -o bin/core ./core/cmd/core
	$(GO) build $(BUILDFLAGS) -o bin/bench ./bench/cmd/bench
	$(GO) build $(BUILDFLAGS) -o bin/devstack ./deploy/cmd/devstack

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

# Benchmarks (each run writes into a new folder under bench/out/): the limiter hot path and
# the live view's recorder and the rate limit service's decisions beside the authorization
# Check (Go benchmarks, compare runs with benchstat; the ext_authz Check with and without the
# recorder in the same run); the authorization load test, the same for the HTTP forward-auth
# check (and Caddy and nginx with the check against without it) and the rate limit
# service's, each against a no-op server in the same run; the core's activity POSTs against
# pgx inserting the same rows directly; the core's capacity and its recovery from an
# overload; and the cluster's overshoot and traffic against the sync interval (about 20
# minutes).
bench: bench-go bench-rls-go bench-authz bench-forward-auth bench-rls bench-core bench-core-overload bench-cluster

bench-go:
	@mkdir -p $(BENCH_OUT)
	$(GO) test -run '^$$' -bench . -benchmem -count 6 ./sidecar/limiter/ | tee $(BENCH_OUT)/limiter.txt
	$(GO) test -run '^$$' -bench . -benchmem -count 6 ./sidecar/traffic/ | tee $(BENCH_OUT)/traffic.txt
	@# The Check with and without the live view's recorder, alternated, so that a busy
	@# machine slows both alike.
	$(GO) test -c -o $(CURDIR)/$(BENCH_OUT)/authz.test ./sidecar/authz/
	cd sidecar/authz && for i in 1 2 3 4 5 6 7 8 9 10; do for m in off on; do \
		$(CURDIR)/$(BENCH_OUT)/authz.test -test.run '^$$' -test.bench "BenchmarkCheck/traffic=$$m\$$" -test.benchmem | grep '^Benchmark'; \
	done; done | tee $(CURDIR)/$(BENCH_OUT)/authz-check.txt
	@rm -f $(CURDIR)/$(BENCH_OUT)/authz.test
	@test -x $(GOBIN)/benchstat || $(GO) install golang.org/x/perf/cmd/benchstat@$(BENCHSTAT_VERSION)
	$(GOBIN)/benchstat $(BENCH_OUT)/limiter.txt
	$(GOBIN)/benchstat $(BENCH_OUT)/traffic.txt
	$(GOBIN)/benchstat -col /traffic $(BENCH_OUT)/authz-check.txt

bench-rls-go:
	@mkdir -p $(BENCH_OUT)
	$(GO) test -run '^$$' -bench 'BenchmarkDecide|BenchmarkCheck' -benchmem -count 6 ./sidecar/rls/ ./sidecar/authz/ | tee $(BENCH_OUT)/rls-decide.txt
	@test -x $(GOBIN)/benchstat || $(GO) install golang.org/x/perf/cmd/benchstat@$(BENCHSTAT_VERSION)
	$(GOBIN)/benchstat $(BENCH_OUT)/rls-decide.txt

bench-authz: build
	./bin/bench authz

bench-forward-auth: build
	./bin/bench forward-auth

bench-rls: build
	./bin/bench rls

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
