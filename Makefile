# sigwatch developer tasks. `make test` is what CI runs (.ci/run).

export PATH := /usr/local/go/bin:$(PATH)

GO ?= go

.PHONY: deps build vet test demo fuzz bench

# deps installs the servers the tests, the demo and the benchmarks start: redis-server,
# redis-cli and mosquitto (nats-server is embedded).
deps:
	@bash deploy/local/install.sh

build:
	$(GO) build -o bin/sigwatch ./cmd/sigwatch

vet:
	$(GO) vet ./...

test: deps
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 12m ./...

# demo starts Redis, Mosquitto and NATS on random local ports and runs sigwatch against them.
demo: deps
	$(GO) run ./cmd/sigwatch demo

# fuzz runs the fuzz targets; the packages that own them fill this in.
fuzz:
	@echo "fuzz: no fuzz targets yet"

# bench runs the benchmark harness; bench/ fills this in.
bench: deps
	@echo "bench: no benchmarks yet"
