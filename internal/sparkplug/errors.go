package sparkplug

// InvalidError is a topic or payload refused. Reason is a short, stable
// token for metric labels and dead letters; Msg is the refusal in plain
// words.
type InvalidError struct {
	Reason string
	Msg    string
}

// Error is the refusal in plain words.
func (e *InvalidError) Error() string { return e.Msg }

// The refusals. They are values so that refusing allocates nothing, and
// callers test them with errors.Is.
var (
	ErrNotSparkplug = &InvalidError{"not_sparkplug", "topic is not in the " + Namespace + " namespace"}
	ErrBadKind      = &InvalidError{"bad_sparkplug_kind", "topic's message type is not a Sparkplug B one"}
	ErrBadLevels    = &InvalidError{"bad_sparkplug_levels", "topic has the wrong number of levels for its message type"}
	ErrEmptyLevel   = &InvalidError{"empty_sparkplug_level", "topic has an empty group, node, device or host id"}
	ErrWildcard     = &InvalidError{"sparkplug_wildcard", "topic has a wildcard ('+' or '#') in an id"}
	ErrBadPayload   = &InvalidError{"bad_sparkplug_payload", "payload is not a Sparkplug B protobuf"}
	ErrBadBdSeq     = &InvalidError{"bad_sparkplug_payload", "payload's bdSeq metric is not a non-negative integer"}
	ErrBadNumber    = &InvalidError{"bad_sparkplug_payload", "payload's timestamp or seq is out of range"}
	ErrBadState     = &InvalidError{"bad_sparkplug_state", `STATE payload is not {"online":..,"timestamp":..}`}
)

// Refusals lists every InvalidError, so metrics can be created up front.
// Some share a reason token: a label counts kinds of input, not messages.
var Refusals = []*InvalidError{
	ErrNotSparkplug, ErrBadKind, ErrBadLevels, ErrEmptyLevel, ErrWildcard,
	ErrBadPayload, ErrBadBdSeq, ErrBadNumber, ErrBadState,
}
