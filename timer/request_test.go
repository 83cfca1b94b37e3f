package timer

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

func TestResetRefusesBadInput(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	l := Limits{MaxPayload: 16}
	ok := Request{After: json.RawMessage(`"30s"`)}
	for _, c := range []struct {
		queue, id string
		r         Request
		want      error
	}{
		{"", "x", ok, ErrBadQueue},
		{"a.b", "x", ok, ErrBadQueue},
		{"a*", "x", ok, ErrBadQueue},
		{"a>", "x", ok, ErrBadQueue},
		{"a/b", "x", ok, ErrBadQueue},
		{strings.Repeat("q", 65), "x", ok, ErrBadQueue},
		{"q", "", ok, ErrBadTimer},
		{"q", strings.Repeat("i", 257), ok, ErrBadTimer},
		{"q", "bad\x00id", ok, ErrBadTimer},
		{"q", "x", Request{}, ErrBadTimer},
		{"q", "x", Request{After: json.RawMessage(`"soon"`)}, ErrBadTimer},
		{"q", "x", Request{After: json.RawMessage(`-5`)}, ErrBadTimer},
		{"q", "x", Request{At: new(int64(-9223372036854775808))}, ErrBadTimer},
		{"q", "x", Request{After: json.RawMessage(`"1s"`), At: new(int64(5))}, ErrBadTimer},
		{"q", "x", Request{At: new(int64(0))}, ErrBadTimer},
		{"q", "x", Request{After: json.RawMessage(`"9000h"`)}, ErrBadTimer},
		{"q", "x", Request{After: json.RawMessage(`"1s"`), Mode: "later"}, ErrBadTimer},
		{"q", "x", Request{After: json.RawMessage(`"1s"`), Payload: json.RawMessage(`{"much":"too long"}`)}, ErrBadPayload},
	} {
		if _, err := l.Reset(c.queue, c.id, c.r, now); !errors.Is(err, c.want) {
			t.Errorf("Reset(%q, %q, %+v) = %v, want %v", c.queue, c.id, c.r, err, c.want)
		}
	}
	// A negative, overflowing or too distant duration is refused, naming
	// the field: -2^63 ms once wrapped to 0 and was taken as "now".
	for _, after := range []string{`-5`, `-9223372036854775808`, `9223372036854775807`, `"-9223372036854775808ns"`,
		`"-1ms"`, `"2562047h47m16.854775808s"`, `"9000h"`, `1e3`} {
		if _, err := l.Reset("q", "x", Request{After: json.RawMessage(after)}, now); !errors.Is(err, ErrBadTimer) ||
			!strings.Contains(err.Error(), "after") {
			t.Errorf("after %s: got %v, want ErrBadTimer naming after", after, err)
		}
	}
	r, err := l.Reset("orders_1-A", "meter/7 #?", Request{After: json.RawMessage(`1500`), Mode: "set", Payload: json.RawMessage(` { "a" : 1 } `)}, now)
	if err != nil || r.Member != "orders_1-A/meter/7 #?" || r.Deadline != now.UnixMilli()+1500 || !r.Set || string(r.Payload) != `{"a":1}` {
		t.Fatalf("%+v %v", r, err)
	}
	if q, id, _ := shard.SplitTimerMember(r.Member); q != "orders_1-A" || id != "meter/7 #?" {
		t.Fatalf("split %q %q", q, id)
	}
}

// FuzzDecodeResets feeds arbitrary NATS reset bodies through the decoder
// and the checks: nothing panics, and whatever is accepted is a member of
// its queue within the limits.
func FuzzDecodeResets(f *testing.F) {
	for _, s := range []string{`{"id":"a","after":"1s"}`, `[{"id":"a","at":1700000000000,"payload":{"x":[1,2]}}]`,
		`{"id":"a","after":1000,"mode":"set","payload":null}`, `[`, `{"after":"-1s"}`, `"x"`, `[{"id":"\u0000"}]`} {
		f.Add([]byte(s), "q")
	}
	now := time.UnixMilli(1_700_000_000_000)
	f.Fuzz(func(t *testing.T, body []byte, queue string) {
		reqs, err := decodeResets(body)
		if err != nil {
			return
		}
		l := Limits{}.withDefaults()
		for _, r := range reqs {
			tr, err := l.Reset(queue, r.ID, r, now)
			if err != nil {
				continue
			}
			q, id, ok := shard.SplitTimerMember(tr.Member)
			if !ok || q != queue || id != r.ID || CheckQueue(q) != nil || len(tr.Payload) > l.MaxPayload {
				t.Fatalf("accepted %+v as %+v", r, tr)
			}
			// Whatever after was, a deadline it gave is never in the past.
			if r.After != nil && tr.Deadline < now.UnixMilli() {
				t.Fatalf("after %s accepted as deadline %d, before now %d", r.After, tr.Deadline, now.UnixMilli())
			}
			if tr.Payload != nil && !json.Valid(tr.Payload) {
				t.Fatalf("payload %q is not JSON", tr.Payload)
			}
		}
	})
}
