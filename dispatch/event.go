package dispatch

import (
	"encoding/base64"
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"
)

// DefaultPrefix is the first token of every subject sigwatch publishes on.
const DefaultPrefix = "sigwatch"

// MaxTypeLen bounds a device type token in a subject.
const MaxTypeLen = 64

// SanitizeType makes a device type safe as one subject token: characters
// outside [A-Za-z0-9_-] become '_', and an empty type is "default". A
// device type can therefore never add a token or a wildcard to a subject.
func SanitizeType(t string) string {
	if t == "" {
		return "default"
	}
	if len(t) > MaxTypeLen {
		t = t[:MaxTypeLen]
	}
	var b []byte
	for i := 0; i < len(t); i++ {
		c := t[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
		if !ok {
			if b == nil {
				b = []byte(t)
			}
			b[i] = '_'
		}
	}
	if b != nil {
		return string(b)
	}
	return t
}

// Subjects builds subject names under a prefix. The Subjects of a
// Bus bound the device types that get a token of their own
// (nats.max_types); a bare Subjects{} does not.
type Subjects struct {
	Prefix string
	types  *typeTokens
}

func (s Subjects) prefix() string {
	if s.Prefix == "" {
		return DefaultPrefix
	}
	return s.Prefix
}

// Lost is the subject of lost events for a device type.
func (s Subjects) Lost(typ string) string { return s.prefix() + ".lost." + s.types.token(typ) }

// AllLost is the wildcard of every lost event's subject.
func (s Subjects) AllLost() string { return s.prefix() + ".lost.>" }

// Recovered is the subject of recovered events for a device type.
func (s Subjects) Recovered(typ string) string {
	return s.prefix() + ".recovered." + s.types.token(typ)
}

// Token is the subject token events of device type typ go out under: the
// sanitised type, or OtherType beyond nats.max_types. What is paced or
// counted per subject is keyed by it, so that its keys are bounded by
// configuration, never by input.
func (s Subjects) Token(typ string) string {
	tok, _ := s.types.admit(typ)
	return tok
}

// Alarm is the subject of alarm notifications for a device type.
func (s Subjects) Alarm(typ string) string { return s.prefix() + ".alarm." + s.types.token(typ) }

// Invalid is the dead-letter subject for input that could not be used.
func (s Subjects) Invalid() string { return s.prefix() + ".invalid" }

// Storm is the subject of storm events: a group or the whole fleet went
// dark or came back.
func (s Subjects) Storm() string { return s.prefix() + ".storm" }

// System is the subject of sigwatch's own state changes.
func (s Subjects) System() string { return s.prefix() + ".system" }

// All is the wildcard of every subject under the prefix. The event stream
// listens on Stream's subjects, not on All: the timer resets
// (TimerSet) belong to a work-queue stream of their own.
func (s Subjects) All() string { return s.prefix() + ".>" }

// Stream lists the subjects of the event stream: every event and fence
// subject, and not the timer resets.
func (s Subjects) Stream() []string {
	p := s.prefix()
	return []string{p + ".lost.>", p + ".recovered.>", p + ".alarm.>", p + ".invalid", p + ".storm",
		p + ".system", p + ".fence.>", p + ".timer.>", p + ".sink.>", p + ".audit"}
}

// added are the subjects of the stream that came with later versions: an
// existing stream gains them rather than being refused.
func (s Subjects) added() []string { return []string{s.prefix() + ".sink.>", s.prefix() + ".audit"} }

// Lost says a device stayed silent past its deadline.
type Lost struct {
	ID       string `json:"id"`
	Device   string `json:"device"`
	Type     string `json:"type"`
	Deadline int64  `json:"deadline"`
	LastSeen int64  `json:"last_seen"`
	FiredAt  int64  `json:"fired_at"`
	Shard    int    `json:"shard"`
	Group    string `json:"group,omitempty"`
	// Reason is what declared the device lost: silence (its deadline
	// passed), will, death, disconnect or declared (see shard.Reason*).
	Reason string `json:"reason"`
	// ConfirmAfter is the hold-down an offline report waited out, ms.
	ConfirmAfter int64 `json:"confirm_after_ms,omitempty"`
}

// LostID is the de-duplication id of the lost event for one deadline.
func LostID(device string, deadline int64) string {
	return device + "@" + strconv.FormatInt(deadline, 10)
}

// Recovered says a lost device signalled again.
type Recovered struct {
	ID          string `json:"id"`
	Device      string `json:"device"`
	Type        string `json:"type"`
	LostAt      int64  `json:"lost_at"`
	RecoveredAt int64  `json:"recovered_at"`
	Group       string `json:"group,omitempty"`
}

// RecoveredID is the de-duplication id of the recovery from the loss at
// deadline: one loss has one recovery.
func RecoveredID(device string, deadline int64) string {
	return LostID(device, deadline) + "/recovered"
}

// Alarm is one transition of a device's alarm.
type Alarm struct {
	ID     string `json:"id"`
	Device string `json:"device"`
	Type   string `json:"type"`
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	Count  int    `json:"count"`
	Since  int64  `json:"since"`
	At     int64  `json:"at"`
	Group  string `json:"group,omitempty"`
	// LastSeen is when the device was last heard of before its loss
	// (unix ms; absent on a group's or the fleet's alarm, and when not
	// known).
	LastSeen int64 `json:"last_seen,omitempty"`
}

// Storm scopes.
const (
	ScopeGroup = "group"
	ScopeFleet = "fleet"
)

// Storm says a group (Scope "group") or the whole fleet (Scope "fleet")
// went dark (State "started") or came back ("ended"). Devices is how many
// of its Watched devices were lost at that moment; Since is when the storm
// started.
type Storm struct {
	ID      string `json:"id"`
	Scope   string `json:"scope"`
	Group   string `json:"group,omitempty"`
	State   string `json:"state"`
	Devices int64  `json:"devices"`
	Watched int64  `json:"watched"`
	Since   int64  `json:"since"`
	At      int64  `json:"at"`
}

// System says sigwatch's own state changed: Kind names what happened
// (e.g. "redis_data_loss", "redis_restored"), Details say more.
type System struct {
	ID      string         `json:"id"`
	Kind    string         `json:"kind"`
	At      int64          `json:"at"`
	Details map[string]any `json:"details,omitempty"`
}

// MaxInvalidPayload bounds how much of a refused payload is forwarded.
const MaxInvalidPayload = 1024

// Invalid is input that could not be used, forwarded for inspection.
type Invalid struct {
	ID              string `json:"id"`
	Reason          string `json:"reason"`
	Topic           string `json:"topic"`
	Payload         string `json:"payload"`
	PayloadEncoding string `json:"payload_encoding,omitempty"`
	Truncated       bool   `json:"truncated,omitempty"`
	At              int64  `json:"at"`
}

// NewInvalid builds an Invalid event; the payload is truncated and base64
// encoded when it is not UTF-8, and the topic is made valid UTF-8.
func NewInvalid(id, reason, topic string, payload []byte, at int64) Invalid {
	ev := Invalid{ID: id, Reason: reason, Topic: strings.ToValidUTF8(topic, "\uFFFD"), At: at}
	if len(ev.Topic) > MaxInvalidPayload {
		ev.Topic = strings.ToValidUTF8(ev.Topic[:MaxInvalidPayload], "")
	}
	if len(payload) > MaxInvalidPayload {
		payload, ev.Truncated = payload[:MaxInvalidPayload], true
	}
	if utf8.Valid(payload) {
		ev.Payload = string(payload)
	} else {
		ev.Payload, ev.PayloadEncoding = base64.StdEncoding.EncodeToString(payload), "base64"
	}
	return ev
}

// Message is one NATS message to publish; ID becomes its Nats-Msg-Id.
type Message struct {
	Subject string
	ID      string
	Body    []byte
}

// Event is what sigwatch publishes: each event knows its subject and its
// de-duplication id, so no caller restates them.
type Event interface {
	// subject is the event's subject under s.
	subject(s Subjects) string
	// msgID is the event's Nats-Msg-Id.
	msgID() string
}

func (ev Lost) subject(s Subjects) string      { return s.Lost(ev.Type) }
func (ev Recovered) subject(s Subjects) string { return s.Recovered(ev.Type) }
func (ev Alarm) subject(s Subjects) string     { return s.Alarm(ev.Type) }
func (ev Storm) subject(s Subjects) string     { return s.Storm() }
func (ev System) subject(s Subjects) string    { return s.System() }
func (ev Invalid) subject(s Subjects) string   { return s.Invalid() }
func (ev Timer) subject(s Subjects) string     { return s.Timer(ev.Queue) }

func (ev Lost) msgID() string      { return ev.ID }
func (ev Recovered) msgID() string { return ev.ID }
func (ev Alarm) msgID() string     { return ev.ID }
func (ev Storm) msgID() string     { return ev.ID }
func (ev System) msgID() string    { return ev.ID }
func (ev Invalid) msgID() string   { return ev.ID }
func (ev Timer) msgID() string     { return ev.ID }

// Encode builds the message of ev on the subjects s (a Bus's
// Subjects): its subject, its id and its JSON body.
func Encode(s Subjects, ev Event) (Message, error) {
	b, err := json.Marshal(ev)
	if err != nil {
		return Message{}, err
	}
	return Message{Subject: ev.subject(s), ID: ev.msgID(), Body: b}, nil
}
