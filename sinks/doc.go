// Package sinks delivers alarm notifications and storm events to the tools
// on-call people already use: Alertmanager, PagerDuty, Slack and signed
// webhooks.
//
// A driver speaks one sink's API: which notifications it takes (wants)
// and one delivery (deliver), whose answer is an outcome the delivery
// engine acts on: accepted, try again later (*RetryError, with the wait
// the sink asked for), gone for good (ErrGone) or refused as it is
// (*RefusedError). Drivers keep no state between calls, so that a
// notification delivered again after a crash or a retry is the same call:
// Alertmanager alerts are identified by their labels, PagerDuty incidents
// by the alarm's id as dedup_key, webhooks by webhook-id.
//
// Each configured sink has a durable consumer on the alarm and storm
// subjects, shared by every alarm replica and holding one notification at
// a time, so that a sink gets them in the order they were published. The
// engine routes each (types, groups), skips what the sink already took
// (ids remembered in Redis), waits for the sink's budget (a pace in Redis,
// across replicas), delivers, retries what the sink may take later, and
// acknowledges it only once the sink took it or it went to the dead
// letters; a 410 disables the sink. Goroutines: Run owns, per sink, its
// delivery loop, its queue-depth poll and (Alertmanager) the re-sending
// of open alarms.
//
// Sink URLs and keys are secrets (a Slack or webhook URL is its own
// credential): no error or log line names them; errors name the kind of
// sink.
//
// Files:
//
//   - sinks.go: Options, New (secrets read, drivers and consumers made),
//     Run, List (GET /v1/sinks) and Test (a marked test notification).
//   - config.go: a sink's configuration, its defaults and rules, and its
//     secrets read from the environment or files.
//   - engine.go: one sink's delivery: route, de-duplicate, pace, deliver,
//     retry, dead-letter, disable; its state.
//   - state.go: what a sink keeps in Redis: delivered ids, its pace, open
//     alarms (Alertmanager), its state for every replica's API.
//   - metrics.go: sigwatch_sink_* metrics.
//   - notification.go: Notification, the driver interface and its outcomes.
//   - http.go: the one POST of every driver: JSON body, per-call timeout,
//     answers mapped to outcomes, Retry-After read.
//   - describe.go: what every driver says of an alarm: its scope, its id
//     without its state, its summary, its devices.
//   - alertmanager.go: alerts of Alertmanager's API v2, firing with a far
//     endsAt, acked by label, resolved with endsAt now.
//   - pagerduty.go: Events API v2 trigger, acknowledge and resolve by
//     dedup_key.
//   - slack.go: one Block Kit message per raise, flap, ack and resolve.
//   - webhook.go: Standard Webhooks, the event's JSON signed with each
//     secret.
package sinks
