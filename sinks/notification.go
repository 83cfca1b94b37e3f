package sinks

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
)

// Notification is what a sink is asked to deliver: one alarm notification
// (sigwatch.alarm.<type>) or storm event (sigwatch.storm). A group's or the
// fleet's alarm carries the storm's lost devices, so that one message
// covers a storm of any size.
type Notification struct {
	// ID is the event's id (its Nats-Msg-Id), the same however often it is
	// delivered: receivers de-duplicate on it.
	ID    string
	Alarm *dispatch.Alarm // an alarm notification, or nil
	Storm *dispatch.Storm // a storm event, or nil
	// Devices are a scope alarm's lost devices, at most MaxDevices; More
	// counts those left out.
	Devices []string
	More    int
	// Test marks a test notification (sigwatch sink test): receivers must
	// be able to tell it from a real alarm.
	Test bool
}

// MaxDevices bounds the devices a notification lists.
const MaxDevices = 50

// Acked is the state of the alarm notification sent when an alarm is
// acknowledged with an end (its repeats pause until then).
const Acked = "acked"

// A driver speaks one kind of sink's API.
type driver interface {
	// wants reports whether the sink takes n at all (PagerDuty pages on
	// a raise, not on its repeats).
	wants(n Notification) bool
	// deliver sends n. nil: the sink accepted it. Otherwise a *RetryError
	// (try again later), ErrGone (the endpoint is gone for good: the sink
	// is disabled) or a *RefusedError (the sink refuses this notification
	// as it is: it goes to the dead letters at once).
	deliver(ctx context.Context, n Notification) error
}

// RetryError says the sink may take the notification later: it answered
// 429 or 5xx, timed out, or could not be reached. After is the wait it
// asked for (Retry-After), 0 if none.
type RetryError struct {
	After time.Duration
	Err   error
}

func (e *RetryError) Error() string { return e.Err.Error() }
func (e *RetryError) Unwrap() error { return e.Err }

// ErrGone: the sink answered 410 Gone.
var ErrGone = errors.New("the endpoint answered 410 Gone: it is gone for good")

// RefusedError says the sink refused the notification itself (a 4xx other
// than 408, 410 and 429): sending it again would not help.
type RefusedError struct {
	Status int
	Body   string // the start of the answer's body
}

func (e *RefusedError) Error() string {
	if e.Status == 0 {
		return e.Body // refused before it was sent
	}
	return fmt.Sprintf("refused with %d: %s", e.Status, e.Body)
}
