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
// Sink URLs and keys are secrets (a Slack or webhook URL is its own
// credential): no error or log line names them; errors name the kind of
// sink.
//
// Files:
//
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
