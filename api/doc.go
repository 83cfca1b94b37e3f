// Package api is sigwatch's HTTP API: every route of a process with the api
// role, built by New from Options and served by one Handler. It sits above
// the roles and calls them; it holds the one mapping of domain errors to
// status codes, the one JSON writer, the one limit parser, and the wire
// types the sigwatch CLI decodes. A use case that spans packages (removing
// a device, setting its group or threshold with the durable registry)
// sits beside its handler, its order written once.
//
// What lives where:
//
//   - api.go: Config (the http section), Options, API, New, Reload and
//     Handler, with the headers every answer carries.
//   - routes.go: every route declared next to the role it needs (Routes),
//     the token check in front of each, and GET /v1/whoami.
//   - auth.go: roles, the tokens of http.tokens and http.token (kept as
//     digests, compared in constant time, read again on SIGHUP), and the
//     caller a request's context carries.
//   - throttle.go: failed authentication slowed per client address.
//   - metrics.go: the API's own metrics.
//   - serve.go: Serve, over HTTPS when http.tls is set (ServerTLS): the
//     certificate read again when its files change or on SIGHUP, mutual
//     TLS with a client CA, HSTS; SIGHUP reads the tokens again too.
//   - respond.go: writeJSON, the error-to-status mapping, the limit of a
//     listing, the id check ingest shares, the body decoder that names an
//     unknown field, and the JSON 404 and 405 of a route that is not there.
//   - health.go: /healthz (liveness) and /readyz (readiness).
//   - deadline.go: every /v1 request answered in time: 503 naming Redis
//     or NATS while it is down, or after http.request_timeout.
//   - devices.go: one device: get, remove, threshold, group (Device).
//   - types.go: a device type's thresholds set at run time, with the
//     durable registry (Type, TypeList).
//   - signals.go: POST /v1/signals (Signal).
//   - lists.go: pages of devices and alarms (DeviceList, AlarmList).
//   - alarms.go: acks and mutes, and the end of an ack or a mute.
//   - storms.go: storms and their acks (StormList).
//   - sinks.go: the sinks' state and test notifications (SinkList).
//   - shards.go: the shards' status (Shards, ShardsStatus) and a doubling
//     (Double, Doubling), which sigwatch shards --config also calls on
//     Redis directly.
//   - stats.go: GET /v1/stats (Stats).
//   - timers.go: the generic timers' routes.
//   - events.go: GET /v1/events, the stream's events as Server-Sent Events.
//   - audit.go: the audit trail: every state-changing call (audited, per
//     route) logged, published on sigwatch.audit and kept in a capped
//     Redis list for GET /v1/audit (AuditRecord, AuditList).
//   - auditqueue.go: the records on their way to Redis and NATS, in
//     order and in batches, so that no answer waits for them.
package api
