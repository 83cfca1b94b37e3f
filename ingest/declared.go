package ingest

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"

	"github.com/sigwatch/sigwatch/shard"
)

// Declared is what a message says of its own deadline, as Eclipse Hono's
// ttd does: alive for a while (TTD > 0), until further notice (TTD -1) or
// gone now (TTD 0); or alive until Next. The zero value declares nothing.
type Declared struct {
	Set  bool
	TTD  int64 // seconds: > 0, -1 or 0; used when Next is 0
	Next int64 // unix ms; 0: none
}

// The refusals of a declared deadline.
var (
	ErrBadTTD  = &InvalidError{Reason: "bad_ttd", Msg: `payload "ttd" must be a whole number of seconds: > 0, -1 (until further notice) or 0 (gone now)`}
	ErrBadNext = &InvalidError{Reason: "bad_next", Msg: `payload "next" must be a time in unix milliseconds`}
)

// ParseDeclared reads "ttd" and "next" from a JSON object payload. A
// payload that mentions neither declares nothing and costs no parse; one
// that is not a JSON object declares nothing either (a plain signal may
// carry anything). A field of the wrong form is refused.
func ParseDeclared(payload []byte) (Declared, error) {
	if !bytes.Contains(payload, []byte(`"ttd"`)) && !bytes.Contains(payload, []byte(`"next"`)) {
		return Declared{}, nil
	}
	var f struct {
		TTD  json.RawMessage `json:"ttd"`
		Next json.RawMessage `json:"next"`
	}
	if err := json.Unmarshal(payload, &f); err != nil {
		return Declared{}, nil
	}
	var d Declared
	if len(f.Next) > 0 && string(f.Next) != "null" {
		n, ok := wholeNumber(f.Next)
		if !ok || n <= 0 {
			return Declared{}, ErrBadNext
		}
		d.Set, d.Next = true, n
		return d, nil
	}
	if len(f.TTD) > 0 && string(f.TTD) != "null" {
		n, ok := wholeNumber(f.TTD)
		if !ok || n < -1 {
			return Declared{}, ErrBadTTD
		}
		d.Set, d.TTD = true, n
	}
	return d, nil
}

// The refusals of a deadline declared in MQTT 5 user properties.
var (
	ErrBadTTDProperty  = &InvalidError{Reason: "bad_ttd", Msg: `user property "ttd" must be a whole number of seconds: > 0, -1 (until further notice) or 0 (gone now)`}
	ErrBadNextProperty = &InvalidError{Reason: "bad_next", Msg: `user property "next" must be a time in unix milliseconds`}
)

// ParseDeclaredProperties reads "ttd" and "next" from a message's MQTT 5
// user properties, which prop looks up; they mean what the payload
// fields do. A message whose payload declares a deadline is not asked.
func ParseDeclaredProperties(prop func(key string) (string, bool)) (Declared, error) {
	if v, ok := prop("next"); ok {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n <= 0 {
			return Declared{}, ErrBadNextProperty
		}
		return Declared{Set: true, Next: n}, nil
	}
	if v, ok := prop("ttd"); ok {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n < -1 {
			return Declared{}, ErrBadTTDProperty
		}
		return Declared{Set: true, TTD: n}, nil
	}
	return Declared{}, nil
}

// wholeNumber reads a JSON number without a fraction that fits an int64.
func wholeNumber(raw json.RawMessage) (int64, bool) {
	var f float64
	if err := json.Unmarshal(raw, &f); err != nil || f != math.Trunc(f) || f >= math.MaxInt64 || f < math.MinInt64 {
		return 0, false
	}
	return int64(f), true
}

// declare applies d to s, a signal stamped at s.at: a deadline the device
// declares replaces its threshold's, bounded by the longest it may
// declare (clamped says it was cut); gone now makes s an offline report of
// the device's own.
func (p *pipeline) declare(s *signal, d Declared) (clamped bool) {
	if !d.Set {
		return false
	}
	bound := p.opts.Thresholds.Declared().Milliseconds()
	var until int64
	switch {
	case d.Next != 0:
		until = d.Next
	case d.TTD == -1:
		until = s.at + bound
	case d.TTD > 0 && d.TTD <= math.MaxInt64/1000-s.at:
		until = s.at + d.TTD*1000
	case d.TTD > 0:
		until = math.MaxInt64
	}
	if until <= s.at {
		s.lower, s.own = shard.ReasonDeclared, true
		return false
	}
	if until > s.at+bound {
		until, clamped = s.at+bound, d.TTD != -1
	}
	s.deadline, s.expired = until, true
	return clamped
}
