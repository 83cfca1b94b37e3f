package timer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// MaxQueueLen bounds a queue name: it is one NATS subject token.
const MaxQueueLen = 64

// DefaultMaxPayload bounds a timer's payload by default (timers.max_payload).
const DefaultMaxPayload = 64 << 10

// Errors of bad input; each is wrapped with the detail.
var (
	ErrBadQueue   = errors.New("bad queue name")
	ErrBadTimer   = errors.New("bad timer")
	ErrBadPayload = errors.New("bad payload")
)

// MaxBatch bounds the resets of one POST /v1/timers/{queue}.
const MaxBatch = 10_000

// MaxBatchBody bounds the body of one POST /v1/timers/{queue} with
// timers.max_payload at maxPayload: 4 MiB of small resets (about 400 B
// each at the most resets) and room for 8 payloads of the largest size.
// The body is decoded whole before anything is stored, so it is what one
// request may hold in memory; more goes in more requests.
func MaxBatchBody(maxPayload int) int64 { return 4<<20 + 8*int64(maxPayload) }

// CheckQueue refuses a queue name outside [A-Za-z0-9_-]{1,64}: the name is
// a subject token, so it can never add a token or a wildcard.
func CheckQueue(q string) error {
	if q == "" || len(q) > MaxQueueLen {
		return fmt.Errorf("%w: %q: 1 to %d characters of A-Z a-z 0-9 _ -", ErrBadQueue, q, MaxQueueLen)
	}
	for i := 0; i < len(q); i++ {
		c := q[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("%w: %q: 1 to %d characters of A-Z a-z 0-9 _ -", ErrBadQueue, q, MaxQueueLen)
		}
	}
	return nil
}

// Request is one reset as the API and the NATS path take it.
type Request struct {
	// ID names the timer in a batch or on NATS (the URL names it on PUT).
	ID string `json:"id,omitempty"`
	// After is a Go duration ("30s") or a number of milliseconds, from
	// the moment the reset is stored.
	After json.RawMessage `json:"after,omitempty"`
	// At is the deadline in unix ms.
	At *int64 `json:"at,omitempty"`
	// Mode is "extend" (the default: the deadline only ever moves later)
	// or "set" (exact, may move it earlier).
	Mode string `json:"mode,omitempty"`
	// Payload is any JSON value; absent keeps the timer's payload, null
	// removes it.
	Payload json.RawMessage `json:"payload,omitempty"`
}

// Limits bound what a reset may hold.
type Limits struct {
	MaxPayload int // bytes, default DefaultMaxPayload
	MaxIDLen   int // bytes, default shard.DefaultMaxIDLen
	// MaxAfter bounds how far ahead a deadline may be, default 366 days.
	MaxAfter time.Duration
}

func (l Limits) withDefaults() Limits {
	if l.MaxPayload <= 0 {
		l.MaxPayload = DefaultMaxPayload
	}
	if l.MaxIDLen <= 0 {
		l.MaxIDLen = shard.DefaultMaxIDLen
	}
	if l.MaxAfter <= 0 {
		l.MaxAfter = 366 * 24 * time.Hour
	}
	return l
}

// Reset turns r, a reset of timer id of queue received at now, into what
// the store writes, or says plainly what is wrong with it.
func (l Limits) Reset(queue, id string, r Request, now time.Time) (shard.TimerReset, error) {
	l = l.withDefaults()
	if err := CheckQueue(queue); err != nil {
		return shard.TimerReset{}, err
	}
	if err := shard.CheckID(id, l.MaxIDLen); err != nil {
		return shard.TimerReset{}, idError(err)
	}
	var deadline int64
	switch {
	case r.At != nil && r.After != nil:
		return shard.TimerReset{}, fmt.Errorf("%w: give either after or at, not both", ErrBadTimer)
	case r.At != nil:
		deadline = *r.At
		if deadline <= 0 {
			return shard.TimerReset{}, fmt.Errorf("%w: at %d is not a unix time in ms", ErrBadTimer, deadline)
		}
	case r.After != nil:
		d, err := parseAfter(r.After)
		if err != nil {
			return shard.TimerReset{}, err
		}
		deadline = now.Add(d).UnixMilli()
	default:
		return shard.TimerReset{}, fmt.Errorf(`%w: give "after" (e.g. "30s") or "at" (unix ms)`, ErrBadTimer)
	}
	if deadline > now.Add(l.MaxAfter).UnixMilli() {
		field := "at"
		if r.After != nil {
			field = "after"
		}
		return shard.TimerReset{}, fmt.Errorf("%w: %s: deadline %d is more than %v ahead", ErrBadTimer, field, deadline, l.MaxAfter)
	}
	out := shard.TimerReset{Member: shard.TimerMember(queue, id), Deadline: deadline}
	switch r.Mode {
	case "", "extend":
	case "set":
		out.Set = true
	default:
		return shard.TimerReset{}, fmt.Errorf(`%w: mode %q: use "extend" or "set"`, ErrBadTimer, r.Mode)
	}
	switch p := bytes.TrimSpace(r.Payload); {
	case r.Payload == nil:
	case string(p) == "null":
		out.ClearPayload = true
	case len(p) > l.MaxPayload:
		return shard.TimerReset{}, fmt.Errorf("%w: %d bytes, the limit is %d (timers.max_payload)", ErrBadPayload, len(p), l.MaxPayload)
	case !json.Valid(p):
		return shard.TimerReset{}, fmt.Errorf("%w: not JSON", ErrBadPayload)
	default:
		out.Payload = compact(p)
	}
	return out, nil
}

// compact returns p without insignificant space, so a payload costs only
// its content.
func compact(p []byte) []byte {
	var b bytes.Buffer
	if json.Compact(&b, p) != nil {
		return p
	}
	return b.Bytes()
}

// parseAfter reads "30s" or 30000 (ms).
func parseAfter(raw json.RawMessage) (time.Duration, error) {
	var (
		d   time.Duration
		err error
	)
	if s := bytes.TrimSpace(raw); len(s) > 0 && s[0] == '"' {
		v := ""
		if len(s) > 1 && s[len(s)-1] == '"' && bytes.IndexByte(s[1:len(s)-1], '\\') < 0 {
			v = string(s[1 : len(s)-1]) // no escapes: the common case, without a decoder
		} else {
			err = json.Unmarshal(s, &v)
		}
		if err == nil {
			d, err = time.ParseDuration(v)
		}
	} else {
		var ms int64
		if ms, err = strconv.ParseInt(string(s), 10, 64); err == nil {
			// Checked before it is multiplied: -2^63 ms wraps to 0 ns.
			if ms < 0 || ms > int64(1<<62/time.Millisecond) {
				err = errors.New("out of range")
			} else {
				d = time.Duration(ms) * time.Millisecond
			}
		}
	}
	if err != nil || d < 0 {
		return 0, fmt.Errorf(`%w: after %s: a duration such as "30s", or milliseconds, not negative`, ErrBadTimer, raw)
	}
	return d, nil
}

// Timer is a stored timer as the API shows it.
type Timer struct {
	Queue    string          `json:"queue"`
	ID       string          `json:"id"`
	Deadline int64           `json:"deadline"`
	Payload  json.RawMessage `json:"payload,omitempty"`
}

// CheckName refuses a queue or an id no reset could have stored.
func (l Limits) CheckName(queue, id string) error {
	if err := CheckQueue(queue); err != nil {
		return err
	}
	if err := shard.CheckID(id, l.MaxIDLen); err != nil {
		return idError(err)
	}
	return nil
}

// idError is an id refusal said of a timer ("timer id is empty"); it is
// still ErrBadTimer and the id rule's error.
func idError(err error) error {
	msg := err.Error()
	var ie *shard.InvalidError
	if errors.As(err, &ie) {
		msg = strings.Replace(ie.Msg, "device id", "timer id", 1)
	}
	return &timerIDError{msg: msg, err: err}
}

type timerIDError struct {
	msg string
	err error
}

func (e *timerIDError) Error() string   { return e.msg }
func (e *timerIDError) Unwrap() []error { return []error{ErrBadTimer, e.err} }
