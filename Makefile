# sigwatch developer tasks. `make test` is what CI runs (.ci/run).

export PATH := /usr/local/go/bin:$(PATH)

GO ?= go

.PHONY: deps test-deps build vet lint test demo run fuzz bench

# deps installs the servers the tests, the demo, `make run` and the benchmarks start: redis-server,
# redis-cli, redis-sentinel and mosquitto (nats-server is embedded); test-deps also chromium,
# the headless browser the status page test drives, Debian's old nats-server, which a test
# sees `sigwatch run` refuse, and prometheus-alertmanager, which the sink tests start.
deps:
	@bash deploy/local/install.sh

test-deps:
	@bash deploy/local/install.sh --browser

# bin/sigwatch is the developer's binary: built with the demo tag, it has `sigwatch demo` and
# `sigwatch dev` (which embed nats-server) besides the service and the CLI. The Dockerfile builds
# the service binary without them.
build:
	$(GO) build -tags demo -o bin/sigwatch ./cmd/sigwatch

# The demo is built only with the demo tag (it embeds nats-server), and bench/ is its own module
# (its load generators and baselines need asynq, pgx and go-redis, the service does not), as is
# deploy/check (the Dockerfile, compose, Kubernetes and alert-rule checks, with k8s.io/api and
# Prometheus's query engine as its own dependencies): vet and lint cover them all.
vet:
	$(GO) vet ./...
	$(GO) vet -tags demo ./cmd/sigwatch
	cd bench && $(GO) vet ./...
	cd deploy/check && $(GO) vet ./...

STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

lint: vet
	$(GO) run $(STATICCHECK) ./...
	$(GO) run $(STATICCHECK) -tags demo ./cmd/sigwatch
	cd bench && $(GO) run $(STATICCHECK) ./...
	cd deploy/check && $(GO) run $(STATICCHECK) ./...

# FUZZ lists package:target pairs; `make test` runs each briefly, `make fuzz` longer.
FUZZ := ./ingest:FuzzParseTopic ./ingest:FuzzParseTimestamp ./ingest:FuzzParseDeclared ./ingest:FuzzParseDeclaredProperties ./ingest:FuzzParseStatus ./dispatch:FuzzSanitizeType ./dispatch:FuzzNewInvalid ./timer:FuzzDecodeResets ./internal/sparkplug:FuzzParseTopic ./internal/sparkplug:FuzzDecode ./internal/webhooks:FuzzVerify
FUZZTIME ?= 10s

# The cmd/sigwatch tests build sigwatch with the demo tag themselves, so TestDemoShowsLostDevices runs
# here. bench/ and deploy/check are modules of their own, which ./... does not reach.
#
# SLOW are the longest process-level fault tests of cmd/sigwatch, which mostly wait out thresholds,
# leases and outages, and the route-by-role and HTTPS tests, which even out the two lines: they run
# in a go test of their own beside ./..., so that cmd/sigwatch is not one long line of them while
# the other packages are long done (a third line of them starved the two cores). Its output is
# shown when it ends.
# SINKSLOW, the sink tests that wait out a 2/s budget over 500 alarms and a receiver down for a
# minute, run in a fourth line; after them, once the other packages are done, the ingest tests run a
# second time with ingest subscribing over MQTT 5 (mqtt.protocol: 5); the tests on the NATS MQTT
# listener, which speaks 3.1.1 only, skip there. The modules bench/ and deploy/check and the fuzz
# targets, which build with every core, come last: beside the fault tests they starved them.
SINKSLOW := ^(TestSinkBudgetTwoPerSecond|TestSinkReceiverDownAMinute)$$
SLOW := ^(TestBrokerBlipLosesNoLiveDevice|TestTimersFireOnceAcrossFaults|TestRedisStoppedAPIAnswersFast|TestRedisKilledAPIAnswersFast|TestRedisRestartedGracefully|TestStalledReplicaBringsNothingBack|TestNATSClusterFailover|TestClockSkewTwoProcesses|TestTwoProcessesKillOne|TestRedisEverySecKilled|TestRedisRestartedEmpty|TestRedisClusterMasterFailover|TestRedisSentinelFailover|TestStormSurvivesRedisLoss|TestTimersSurviveRedisEmpty|TestTimersSentinelFailoverToLaggedReplica|TestSinksCarryRealAlarms|TestSinkDeliveryAcrossKill|TestEveryRouteEveryRole|TestHTTPSEndToEnd|TestHTTPSMutualTLS)$$

test: test-deps lint
	@slow=$$(mktemp); mq5=$$(mktemp); \
	$(GO) test -race -count=1 -timeout 18m -run '$(SLOW)' ./cmd/sigwatch > $$slow 2>&1 & pid=$$!; \
	{ $(GO) test -race -count=1 -timeout 12m -run '$(SINKSLOW)' ./sinks && \
	  SIGWATCH_TEST_MQTT_PROTOCOL=5 $(GO) test -race -count=1 -timeout 10m ./ingest; } > $$mq5 2>&1 & pid5=$$!; \
	$(GO) test -race -count=1 -timeout 18m -skip '$(SLOW)|$(SINKSLOW)' ./...; rc=$$?; \
	wait $$pid; src=$$?; wait $$pid5; m5=$$?; \
	echo "--- cmd/sigwatch, the slow fault tests:"; cat $$slow; \
	echo "--- the long sink tests, and ingest over MQTT 5:"; tail -n 200 $$mq5; \
	rm -f $$slow $$mq5; \
	[ $$rc -eq 0 ] && [ $$src -eq 0 ] && [ $$m5 -eq 0 ]
	cd bench && $(GO) test -race -count=1 -timeout 12m ./...
	cd deploy/check && $(GO) test -count=1 -timeout 10m ./...
	@$(MAKE) --no-print-directory fuzz FUZZTIME=3s

# demo starts Redis, Mosquitto and NATS on random local ports and runs sigwatch against them with
# a simulated fleet.
demo: deps build
	@bin/sigwatch demo

# run starts Redis, Mosquitto and NATS with JetStream (on 6379, 1883 and 4222 where free) and runs
# the real service on them with deploy/sigwatch.yaml's settings and any SIGWATCH_* variables, the
# API on 8080: publish to devices/<id>/signal and watch with bin/sigwatch events. Ctrl-C stops all.
run: deps build
	@bin/sigwatch dev

# fuzz runs every fuzz target for FUZZTIME (default 10s; make fuzz FUZZTIME=5m).
fuzz:
	@set -e; for f in $(FUZZ); do \
		pkg=$${f%%:*}; target=$${f##*:}; \
		echo "fuzz $$pkg $$target ($(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) $$pkg; \
	done

# bench runs the benchmark harness's quick profile and writes bench/RESULTS.md; bench/ is its own module.
bench: deps
	cd bench && $(GO) run ./cmd/sigwatch-bench -profile quick
