// Package testenv is sigwatch's one test kit.
//
// New gives a test, in one call, the real servers sigwatch runs against: a Redis always, and on
// request a Mosquitto broker and an embedded NATS (with JetStream, and optionally its MQTT
// listener); Alertmanager starts a Prometheus Alertmanager. Each runs on 127.0.0.1 on a random port in the test's t.TempDir() and is stopped by
// t.Cleanup. A missing server binary fails the test with how to install it; tests never skip
// for it. Env.Store and Env.Conn give the clients a test builds on those servers.
//
// Beside the servers the kit holds the mechanics every package's tests share: polling with a
// deadline instead of sleeping (WaitFor, Never), recorders of the events sigwatch publishes on
// NATS (Record, RecordStream, StreamMsgIDs), goroutine-leak checks on go.uber.org/goleak
// (VerifyNone), metric reads beside prometheus/testutil (Gathered, Scraped, Observations), a
// manual clock for time-driven tests (Clock), and local HTTP receivers that keep the documented
// contracts of PagerDuty, Slack and Standard Webhooks, for tests to point sinks at.
//
// testenv imports only shard and internal packages, never a role package (ingest, scanner,
// alarm), so that every package's tests can use it.
//
// Files:
//
//   - testenv.go: Options, Env and New: the servers of one test, and the
//     clients on them.
//   - cluster.go: a Redis Cluster or a NATS cluster for a test.
//   - alertmanager.go: a Prometheus Alertmanager for a test.
//   - mqtt.go: an MQTT client on a test broker, and an MQTT 5 one.
//   - proxy.go: a TCP proxy that holds, releases or cuts a connection.
//   - edgenode.go: a Sparkplug B edge node behind a proxy of its own
//     (EdgeNode): births, data, its NDEATH will on a cut or a pulled
//     cable, rebirths with the next bdSeq, stale deaths.
//   - recorder.go: recorders of the events sigwatch publishes (Record,
//     RecordStream, StreamMsgIDs).
//   - stream.go: reading a stream's messages (StreamMessages, MaxInWindow).
//   - wait.go: polling with a deadline (WaitFor, Never).
//   - leak.go: goroutine-leak checks on goleak (VerifyNone).
//   - metrics.go: metric reads (Gathered, Scraped, Observations, Series).
//   - logbuf.go: LogBuffer, a log sink the code under test may write to
//     from many goroutines.
//   - clock.go: a manual clock (Clock).
//   - tlscerts.go: a throwaway CA (NewCA) that issues server and client
//     certificates as PEM files.
//   - receivers.go: Receiver, a local HTTP server that records every call
//     (Call) and can be taken down and brought back on its port; OverBudget,
//     the sliding-window check of a rate budget.
//   - pagerduty.go: a PagerDuty Events API v2 receiver (NewPagerDuty).
//   - slack.go: a Slack incoming-webhook receiver (NewSlack).
//   - webhookreceiver.go: a Standard Webhooks receiver that verifies
//     signatures, counts deliveries by id and answers 429, 410 or 500 on
//     demand (NewWebhookReceiver).
package testenv
