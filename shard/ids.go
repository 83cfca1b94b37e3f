package shard

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// DefaultMaxIDLen bounds a device id in bytes when no other limit is set.
const DefaultMaxIDLen = 256

// ReservedIDPrefix starts the ids sigwatch keeps for itself (ingest's
// probes, the alarm's group and fleet storms): no device or timer may use
// them.
const ReservedIDPrefix = "$sigwatch-"

// InvalidError is an id, type or group refused by the id rules, or other
// input a role refuses. Reason is a short, stable token used as a metric
// label and as the reason of a dead-letter event.
type InvalidError struct {
	Reason string
	Msg    string
}

// Error is the refusal in plain words: it reaches API callers as it is.
func (e *InvalidError) Error() string { return e.Msg }

// The refusals of the id rules. They are values so that refusing allocates
// nothing, and callers test them with errors.Is.
var (
	ErrEmptyID    = &InvalidError{"empty_id", "device id is empty"}
	ErrIDTooLong  = &InvalidError{"id_too_long", "device id is too long"}
	ErrBadID      = &InvalidError{"bad_id", "device id has control characters or is not UTF-8"}
	ErrReservedID = &InvalidError{"reserved_id", "device ids starting with " + ReservedIDPrefix + " are sigwatch's own"}
	ErrBadType    = &InvalidError{"bad_type", "device type has control characters, is not UTF-8 or is too long"}
	ErrBadGroup   = &InvalidError{"bad_group", "device group has control characters, is not UTF-8 or is too long"}
)

// CheckID is the one rule for ids, wherever they come from (an MQTT topic,
// Signal, the HTTP API, a timer reset): an id is non-empty, at most maxIDLen
// bytes (DefaultMaxIDLen when maxIDLen <= 0), valid UTF-8, free of control
// characters (C0, DEL and C1) and outside ReservedIDPrefix. It returns
// ErrEmptyID, ErrIDTooLong, ErrBadID or ErrReservedID, and allocates nothing.
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

// CheckType applies the id rules to a device type, which may be empty:
// ErrBadType.
func CheckType(typ string, maxIDLen int) error {
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
	if CheckType(group, maxIDLen) != nil {
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
