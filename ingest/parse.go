package ingest

import (
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// DefaultMaxIDLen bounds a device id in bytes when no other limit is set.
const DefaultMaxIDLen = 256

// InvalidError is input ingest refuses. Reason is a short, stable token used
// as the metric label and the reason of the dead-letter event.
type InvalidError struct {
	Reason string
	msg    string
}

func (e *InvalidError) Error() string { return "ingest: " + e.msg }

// The refusals. They are values so the hot path allocates nothing to refuse,
// and callers test them with errors.Is.
var (
	ErrNoIDLevel        = &InvalidError{"no_id_level", "topic has no device id level"}
	ErrEmptyID          = &InvalidError{"empty_id", "device id is empty"}
	ErrIDTooLong        = &InvalidError{"id_too_long", "device id is too long"}
	ErrBadID            = &InvalidError{"bad_id", "device id has control characters or is not UTF-8"}
	ErrReservedID       = &InvalidError{"reserved_id", "device ids starting with " + ReservedIDPrefix + " are sigwatch's own"}
	ErrBadType          = &InvalidError{"bad_type", "device type has control characters, is not UTF-8 or is too long"}
	ErrBadGroup         = &InvalidError{"bad_group", "device group has control characters, is not UTF-8 or is too long"}
	ErrBadPayload       = &InvalidError{"bad_payload", "payload is not a JSON object"}
	ErrMissingTimestamp = &InvalidError{"missing_timestamp", `payload has no "ts" field`}
	ErrBadTimestamp     = &InvalidError{"bad_timestamp", `payload "ts" is neither unix ms nor RFC 3339`}
)

// reasons lists every InvalidError, so metrics can be created up front.
var reasons = []*InvalidError{
	ErrNoIDLevel, ErrEmptyID, ErrIDTooLong, ErrBadID, ErrReservedID, ErrBadType,
	ErrBadGroup, ErrBadPayload, ErrMissingTimestamp, ErrBadTimestamp,
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
// level, the device type (group). The id must pass CheckID; the type and
// the group obey the same rules but may be empty. Characters that are
// special in NATS subjects ('*', '>', '.', spaces) are valid: ids never
// become subjects, and types and groups only sanitised.
//
// ParseTopic does not allocate: id, typ and group share topic's memory.
func ParseTopic(topic string, idLevel, typeLevel, groupLevel int, maxIDLen int) (id, typ, group string, err error) {
	if idLevel < 0 {
		return "", "", "", ErrNoIDLevel
	}
	if maxIDLen <= 0 {
		maxIDLen = DefaultMaxIDLen
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
	if err := CheckID(id, maxIDLen); err != nil {
		return "", "", "", err
	}
	if err := checkType(typ, maxIDLen); err != nil {
		return "", "", "", err
	}
	if err := CheckGroup(group, maxIDLen); err != nil {
		return "", "", "", err
	}
	return id, typ, group, nil
}

// CheckID is the one rule for device ids, wherever they come from (an MQTT
// topic, Signal, the HTTP API): an id is non-empty, at most maxIDLen bytes
// (DefaultMaxIDLen when maxIDLen <= 0), valid UTF-8 and free of control
// characters (C0, DEL and C1). It returns ErrEmptyID, ErrIDTooLong or
// ErrBadID, which callers test with errors.Is, and allocates nothing.
func CheckID(id string, maxIDLen int) error {
	if maxIDLen <= 0 {
		maxIDLen = DefaultMaxIDLen
	}
	switch {
	case id == "":
		return ErrEmptyID
	case len(id) > maxIDLen:
		return ErrIDTooLong
	case !printable(id):
		return ErrBadID
	case strings.HasPrefix(id, ReservedIDPrefix):
		return ErrReservedID
	}
	return nil
}

// checkType applies the id rules to a device type, which may be empty.
func checkType(typ string, maxIDLen int) error {
	if maxIDLen <= 0 {
		maxIDLen = DefaultMaxIDLen
	}
	if len(typ) > maxIDLen || !printable(typ) {
		return ErrBadType
	}
	return nil
}

// CheckGroup applies the type rules to a device group, which may be empty
// (none): ErrBadGroup.
func CheckGroup(group string, maxIDLen int) error {
	if checkType(group, maxIDLen) != nil {
		return ErrBadGroup
	}
	return nil
}

// printable reports whether s is valid UTF-8 without control characters
// (C0, DEL, C1).
func printable(s string) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f {
				return false
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || unicode.IsControl(r) {
			return false
		}
		i += size
	}
	return true
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
