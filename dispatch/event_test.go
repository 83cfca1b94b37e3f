package dispatch

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestSubjectsNeverCarryDeviceData(t *testing.T) {
	s := Subjects{}
	for typ, want := range map[string]string{
		"":            "sigwatch.lost.default",
		"meter":       "sigwatch.lost.meter",
		"a.b":         "sigwatch.lost.a_b",
		"*":           "sigwatch.lost._",
		">":           "sigwatch.lost._",
		"has space":   "sigwatch.lost.has_space",
		"tr-ack_er":   "sigwatch.lost.tr-ack_er",
		"ünïcode":     "sigwatch.lost.__n__code",
		"x\x00y\r\nz": "sigwatch.lost.x_y__z",
	} {
		if got := s.Lost(typ); got != want {
			t.Errorf("Lost(%q) = %q, want %q", typ, got, want)
		}
	}
}

// FuzzSanitizeType proves that no device type can add a token, a wildcard
// or whitespace to a subject.
func FuzzSanitizeType(f *testing.F) {
	for _, s := range []string{"", "meter", "a.b.c", "*", ">", "\x00", strings.Repeat("x", 200)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, typ string) {
		tok := SanitizeType(typ)
		if tok == "" || len(tok) > MaxTypeLen {
			t.Fatalf("SanitizeType(%q) = %q: empty or longer than %d", typ, tok, MaxTypeLen)
		}
		for i := 0; i < len(tok); i++ {
			c := tok[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
				t.Fatalf("SanitizeType(%q) = %q: byte %q not allowed in a subject token", typ, tok, c)
			}
		}
	})
}

// FuzzNewInvalid proves that whatever a device sends, the dead-letter event
// is valid JSON that gives the payload back (truncated) byte for byte.
func FuzzNewInvalid(f *testing.F) {
	f.Add("devices//signal", []byte("junk"))
	f.Add("devices/\xff/signal", []byte{0xff, 0xfe, 0})
	f.Fuzz(func(t *testing.T, topic string, payload []byte) {
		ev := NewInvalid("id", "reason", topic, payload, 1)
		b, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		var back Invalid
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("round trip: %v", err)
		}
		if !utf8.ValidString(back.Topic) {
			t.Fatalf("topic %q is not UTF-8", back.Topic)
		}
		want := payload
		if len(want) > MaxInvalidPayload {
			want = want[:MaxInvalidPayload]
		}
		got := []byte(back.Payload)
		if back.PayloadEncoding == "base64" {
			if got, err = base64.StdEncoding.DecodeString(back.Payload); err != nil {
				t.Fatal(err)
			}
		}
		if string(got) != string(want) {
			t.Fatalf("payload %q came back as %q", want, got)
		}
	})
}
