package ingest

import (
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// InvalidError is input ingest refuses: one of the id rules' refusals
// (shard) or one of its own below.
type InvalidError = shard.InvalidError

// The refusals. They are values so the hot path allocates nothing to refuse,
// and callers test them with errors.Is. The id, type and group refusals are
// the id rules' own, from shard.
var (
	ErrNoIDLevel        = &InvalidError{Reason: "no_id_level", Msg: "topic has no device id level"}
	ErrEmptyID          = shard.ErrEmptyID
	ErrIDTooLong        = shard.ErrIDTooLong
	ErrBadID            = shard.ErrBadID
	ErrReservedID       = shard.ErrReservedID
	ErrBadType          = shard.ErrBadType
	ErrBadGroup         = shard.ErrBadGroup
	ErrBadPayload       = &InvalidError{Reason: "bad_payload", Msg: "payload is not a JSON object"}
	ErrMissingTimestamp = &InvalidError{Reason: "missing_timestamp", Msg: `payload has no "ts" field`}
	ErrBadTimestamp     = &InvalidError{Reason: "bad_timestamp", Msg: `payload "ts" is neither unix ms nor RFC 3339`}
)

// reasons lists every InvalidError, so metrics can be created up front.
var reasons = []*InvalidError{
	ErrNoIDLevel, ErrEmptyID, ErrIDTooLong, ErrBadID, ErrReservedID, ErrBadType,
	ErrBadGroup, ErrBadPayload, ErrMissingTimestamp, ErrBadTimestamp, ErrBadTTD, ErrBadNext, ErrBadStatus, ErrBadConnEvent,
}

// reasonOf returns the reason token of err ("other" if it is no InvalidError).
func reasonOf(err error) string {
	var ie *InvalidError
	if errors.As(err, &ie) {
		return ie.Reason
	}
	return "other"
}

// ParseTopic extracts the device id at level idLevel (0-based, levels split
// by '/') and, when typeLevel (groupLevel) >= 0 and the topic has that
// level, the device type (group). The id must pass shard.CheckID; the type and
// the group obey the same rules but may be empty. Characters that are
// special in NATS subjects ('*', '>', '.', spaces) are valid: ids never
// become subjects, and types and groups only sanitised.
//
// ParseTopic does not allocate: id, typ and group share topic's memory.
func ParseTopic(topic string, idLevel, typeLevel, groupLevel int, maxIDLen int) (id, typ, group string, err error) {
	if idLevel < 0 {
		return "", "", "", ErrNoIDLevel
	}
	last := max(idLevel, typeLevel, groupLevel)
	haveID := false
	rest := topic
	for level := 0; level <= last; level++ {
		seg, tail, more := strings.Cut(rest, "/")
		if level == idLevel {
			id, haveID = seg, true
		}
		if level == typeLevel {
			typ = seg
		}
		if level == groupLevel {
			group = seg
		}
		if !more {
			break
		}
		rest = tail
	}
	if !haveID {
		return "", "", "", ErrNoIDLevel
	}
	if err := shard.CheckID(id, maxIDLen); err != nil {
		return "", "", "", err
	}
	if err := shard.CheckType(typ, maxIDLen); err != nil {
		return "", "", "", err
	}
	if err := shard.CheckGroup(group, maxIDLen); err != nil {
		return "", "", "", err
	}
	return id, typ, group, nil
}

// ParseTimestamp reads the signal time from a JSON object payload: its "ts"
// field is a number of unix milliseconds (fractions are dropped) or an RFC
// 3339 string. A payload that is not a JSON object, has no "ts" (or a null
// one), or has a "ts" of another form is refused.
func ParseTimestamp(payload []byte) (time.Time, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(payload, &fields); err != nil || fields == nil {
		return time.Time{}, ErrBadPayload
	}
	raw, ok := fields["ts"]
	if !ok || string(raw) == "null" {
		return time.Time{}, ErrMissingTimestamp
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return time.Time{}, ErrBadTimestamp
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return time.Time{}, ErrBadTimestamp
		}
		return t, nil
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		if ms, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
			return time.UnixMilli(ms), nil
		}
		f, err := strconv.ParseFloat(string(raw), 64)
		// 2^63 is exactly representable; anything at or beyond it does not fit.
		if err != nil || math.IsNaN(f) || f >= math.MaxInt64 || f < math.MinInt64 {
			return time.Time{}, ErrBadTimestamp
		}
		return time.UnixMilli(int64(f)), nil
	default:
		return time.Time{}, ErrBadTimestamp
	}
}

// clamp keeps a device's clock from pushing a deadline into the future or
// far into the past: at is moved into [now-skew, now].
func clamp(at, now time.Time, skew time.Duration) time.Time {
	return clampTo(at, now.Add(-skew), now)
}

// clampTo moves at into [lo, hi]. The upper bound wins when lo is above hi:
// a signal is never stamped later than the evidence allows.
func clampTo(at, lo, hi time.Time) time.Time {
	if at.Before(lo) {
		at = lo
	}
	if at.After(hi) {
		return hi
	}
	return at
}
