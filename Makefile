# relayd — run `make help` for the targets.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO        ?= go
BIN       := bin
# The release version: the VERSION file, the one source that Chart.yaml's
# appVersion and the kustomize base's image tag follow (test/deploy checks
# that they agree). `relayd version` prints it with the commit.
VERSION   ?= $(shell cat $(CURDIR)/VERSION)
COMMIT    ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
BUILDDATE ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
VPKG      := github.com/relayd/relayd/internal/version
LDFLAGS   := -s -w -X $(VPKG).Version=$(VERSION) -X $(VPKG).Commit=$(COMMIT) -X $(VPKG).BuildDate=$(BUILDDATE)
# The same flags as the Dockerfile, so tests exercise the shipped binary.
GOBUILD   := CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)"

# staticcheck is pinned here and fetched through the Go module proxy.
STATICCHECK_VERSION ?= v0.8.2
TESTFLAGS ?=
TEST_TIMEOUT ?= 30m
# Test packages run at once (go test -p). Most of a real-server test is
# waiting on servers, so four at a time fill 2 cores without starving them
# (the default, one per core, left a core idle for much of the run).
TEST_PARALLEL ?= 4

export RELAYD_TESTENV_BIN ?= $(CURDIR)/.cache/testenv/k8s-v1.37.1-etcd-v3.7.0
# The second Kubernetes version of the tests (internal/testenv K8sVersionPrev).
export RELAYD_TESTENV_BIN_PREV ?= $(CURDIR)/.cache/testenv/k8s-v1.35.4-etcd-v3.7.0
export RELAYD_BIN := $(CURDIR)/$(BIN)/relayd
# The test build: the same, with -tags testbuild, which honours the tests'
# switches (RELAYD_INDEX_CHECK); the shipped binary ignores them and does
# not contain the code (docs/RELIABILITY.md). Tests that turn the index
# consistency check on run this one (internal/testenv RelaydTestBin).
export RELAYD_TEST_BIN := $(CURDIR)/$(BIN)/relayd-test

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z_-]+:.*## /{printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build bin/relayd (static, trimmed, version-stamped: the shipped binary) and bin/relayd-test (the same with -tags testbuild, for the tests).
	$(GOBUILD) -o $(BIN)/relayd ./cmd/relayd
	$(GOBUILD) -tags testbuild -o $(BIN)/relayd-test ./cmd/relayd

# `make image` builds the container image as <IMAGE>:<VERSION>, the tag the
# chart and the kustomize base pull by default (docs/DEPLOY.md, "The image").
IMAGE     ?= ghcr.io/relayd/relayd
DOCKER    ?= docker

.PHONY: image
image: ## Build the container image $(IMAGE):$(VERSION) with docker (IMAGE=registry.example.com/relayd to push to your registry).
	$(DOCKER) build -t $(IMAGE):$(VERSION) --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) --build-arg BUILDDATE=$(BUILDDATE) .

.PHONY: kustomize-bin
kustomize-bin: ## Build kustomize (pinned in tools/kustomize/go.mod) into .cache/kustomize/ for test/deploy (cold: ~1 min; then cached).
	hack/kustomize-bin.sh >/dev/null

.PHONY: helm-bin
helm-bin: ## Build helm (pinned in tools/helm/go.mod) into .cache/helm/ for test/deploy (cold: ~1 min; then cached).
	hack/helm-bin.sh >/dev/null

.PHONY: testenv-bins
testenv-bins: ## Build etcd + kube-apiserver v1.37 and v1.35 for tests into .cache/ (cold: 7 min on the CI machine, up to 20 on slower 2-core ones; then cached).
	hack/testenv-bins.sh >/dev/null

.PHONY: testenv-bins-current
testenv-bins-current: ## Build etcd + kube-apiserver v1.37 only (what demo, bench and chaos run on).
	hack/testenv-bins.sh --current-only >/dev/null

.PHONY: nats-server-bin
nats-server-bin: ## Build nats-server (the version go.mod requires) into .cache/nats-server/ for the JetStream-cluster tests, which run it as child processes (cold: ~30 s; then cached).
	hack/nats-server-bin.sh >/dev/null

.PHONY: prometheus-bin
prometheus-bin: ## Build prometheus + promtool (pinned in tools/prometheus/go.mod) into .cache/prometheus/ for test/observability (cold, measured at c558367: 7 min 46 s on the shared 2-core machine under load, 283 CPU-s, 1.1 GB modules + 1 GB build cache; then cached).
	hack/prometheus-bin.sh >/dev/null

.PHONY: demo
demo: testenv-bins-current build ## Run relayd against local etcd + kube-apiserver + NATS and watch the events arrive (Ctrl-C stops it all).
	RELAYD_BIN=$(RELAYD_BIN) $(GO) run ./internal/demo

.PHONY: sandbox
sandbox: testenv-bins-current build ## Start etcd, kube-apiserver, NATS and relayd (demo config) and keep them running: prints KUBECONFIG, the NATS URL and three things to try; Ctrl-C stops it all.
	RELAYD_BIN=$(RELAYD_BIN) $(GO) run ./internal/demo -sandbox

# `make bench` (docs/PERFORMANCE.md): the Go micro-benchmarks of the hot
# path (compared with benchstat to the previous run's, if any; the
# CloudEvents encoder also next to sdk-go's, and the CEL filter on raw
# bytes next to decoding into a map, same run), then the
# side-by-side harness (internal/bench) against bin/relayd. BENCHFLAGS go to
# relayd-bench run (e.g. BENCHFLAGS="-events 100000 -repeat 5"; -h lists them).
BENCH_DIR         ?= .cache/bench
BENCH_COUNT       ?= 6
BENCH_TIME        ?= 500ms
BENCHFLAGS        ?=
BENCHSTAT_VERSION ?= v0.0.0-20260908200009-22c9c6c9d4da
.PHONY: bench
bench: testenv-bins-current build ## Measure relayd next to client-go consumers (capacity, latency, memory, checkpoints, recovery) and the hot-path micro-benchmarks; see docs/PERFORMANCE.md (~10 min on 2 cores; the first run also records the watch streams, ~5 min).
	@mkdir -p $(BENCH_DIR)
	@if [ -s $(BENCH_DIR)/micro.txt ]; then mv $(BENCH_DIR)/micro.txt $(BENCH_DIR)/micro-prev.txt; fi
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCH_TIME) -count $(BENCH_COUNT) ./pkg/event ./pkg/index ./pkg/source ./pkg/filter ./pkg/heartbeat ./pkg/watch > $(BENCH_DIR)/micro.txt
	@if [ -s $(BENCH_DIR)/micro-prev.txt ]; then \
	  $(GO) run golang.org/x/perf/cmd/benchstat@$(BENCHSTAT_VERSION) prev=$(BENCH_DIR)/micro-prev.txt new=$(BENCH_DIR)/micro.txt; \
	else $(GO) run golang.org/x/perf/cmd/benchstat@$(BENCHSTAT_VERSION) $(BENCH_DIR)/micro.txt; fi | tee $(BENCH_DIR)/micro-benchstat.txt
	$(GO) run golang.org/x/perf/cmd/benchstat@$(BENCHSTAT_VERSION) -filter '.name:EncodeVsSDK' -col /encoder $(BENCH_DIR)/micro.txt | tee $(BENCH_DIR)/micro-encoder-vs-sdk.txt
	$(GO) run golang.org/x/perf/cmd/benchstat@$(BENCHSTAT_VERSION) -filter '.name:FilterPod' -col /filter $(BENCH_DIR)/micro.txt | tee $(BENCH_DIR)/micro-filter.txt
	$(GO) build -o $(BENCH_DIR)/relayd-bench ./internal/bench/cmd/relayd-bench
	$(BENCH_DIR)/relayd-bench run -relayd $(BIN)/relayd -cache $(BENCH_DIR) $(BENCHFLAGS)

# `make bench-scale` (docs/PERFORMANCE.md, "Scale"): relayd at the size of
# the largest clusters, same harness and report style as `make bench`.
# SCALEFLAGS go to relayd-bench scale (e.g. SCALEFLAGS=-quick for a
# CI-sized smoke run, SCALEFLAGS="-steps tracked -objects 10000,100000";
# -h lists them).
SCALEFLAGS ?=
.PHONY: bench-scale
bench-scale: testenv-bins-current nats-server-bin build ## Measure relayd at scale: 1M tracked objects (replayed), restart and 410 at 1M, per-namespace watches and 200 sources on kube-apiserver, the sustained-rate knee into R1 and R3 (5-minute holds); see docs/PERFORMANCE.md "Scale" (< 30 min on 2 cores; SCALEFLAGS=-quick: a few minutes).
	@mkdir -p $(BENCH_DIR)
	$(GO) build -o $(BENCH_DIR)/relayd-bench ./internal/bench/cmd/relayd-bench
	$(BENCH_DIR)/relayd-bench scale -relayd $(BIN)/relayd -cache $(BENCH_DIR) $(SCALEFLAGS)

# vet and staticcheck type-check with -race, the configuration the tests
# compile in: a cold `make test` then compiles the dependencies twice
# (-race, and bin/relayd's static build), not three times.
STATICCHECK := $(CURDIR)/.cache/bin/staticcheck-$(STATICCHECK_VERSION)

.PHONY: vet
vet: ## go vet (-race build configuration).
	$(GO) vet -race ./...

$(STATICCHECK):
	@mkdir -p $(dir $@)
	GOBIN=$(CURDIR)/.cache/bin/tmp $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(CURDIR)/.cache/bin/tmp/staticcheck $@

.PHONY: lint
lint: vet $(STATICCHECK) ## gofmt check, go vet, staticcheck.
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^tools/') 2>&1); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	GOFLAGS=-race $(STATICCHECK) ./...

.PHONY: schema
schema: ## Regenerate the config schema (values.schema.json's config, docs/config.schema.json) from pkg/config's structs.
	$(GO) test ./pkg/config -run TestSchemaFilesAreGenerated -count=1 -update

.PHONY: test
test: testenv-bins nats-server-bin kustomize-bin helm-bin prometheus-bin build lint ## Build test servers if needed, lint, and run all tests with -race against real servers.
	$(GO) test -race -p $(TEST_PARALLEL) -timeout $(TEST_TIMEOUT) $(TESTFLAGS) ./...

# `make chaos` (docs/RELIABILITY.md): the fault-injection matrix of
# test/chaos — kill -9 at random and at failpoints, SIGSTOP, apiserver
# restart and SIGKILL, etcd restart, 410 by compaction, NATS restart,
# JetStream cluster leader and quorum loss, full stream, TCP proxy faults —
# run over and over with new seeds until CHAOS_BUDGET is spent. Every run's
# history is checked; failed runs leave it as JSON in CHAOS_ARTIFACTS.
# The short version (each scenario once) runs inside `make test`.
CHAOS_BUDGET    ?= 20m
CHAOS_TABLE     ?= $(CURDIR)/.cache/chaos/results.md
CHAOS_ARTIFACTS ?= $(CURDIR)/.cache/chaos/artifacts
CHAOS_FLAGS     ?=

.PHONY: chaos
chaos: testenv-bins-current nats-server-bin ## Fault-injection matrix for CHAOS_BUDGET (default 20m); results table in CHAOS_TABLE, failed histories in CHAOS_ARTIFACTS.
	@mkdir -p $(dir $(CHAOS_TABLE)) $(CHAOS_ARTIFACTS)
	$(GO) test -count=1 -timeout 0 -v -run '^TestChaos$$' ./test/chaos \
		-chaos.budget=$(CHAOS_BUDGET) -chaos.table=$(CHAOS_TABLE) -chaos.artifacts=$(CHAOS_ARTIFACTS) $(CHAOS_FLAGS) \
		| grep --line-buffered -E '^ *(=== RUN|--- |chaos_test|\||PASS|FAIL|ok)' ; exit $${PIPESTATUS[0]}
	@echo "results: $(CHAOS_TABLE)"

.PHONY: clean
clean: ## Remove build output (keeps the test-server cache; `make distclean` removes it).
	rm -rf $(BIN)

.PHONY: distclean
distclean: clean ## Also remove the cached test servers and the Node.js example's npm packages and build.
	rm -rf .cache examples/consumer-node/node_modules examples/consumer-node/dist
