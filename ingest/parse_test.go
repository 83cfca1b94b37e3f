package ingest

import (
	"errors"
	"github.com/sigwatch/sigwatch/shard"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"
)

func TestParseTopic(t *testing.T) {
	long := strings.Repeat("x", 257)
	for _, tc := range []struct {
		topic            string
		idLevel, typeLvl int
		id, typ          string
		err              error
	}{
		{"devices/d1/signal", 1, -1, "d1", "", nil},
		{"devices/pump/d1/signal", 2, 1, "d1", "pump", nil},
		{"devices/pump/d1", 2, 3, "d1", "", nil}, // no type level: default type
		{"d1/signal", 0, -1, "d1", "", nil},
		{"devices/a.b*c> d/signal", 1, -1, "a.b*c> d", "", nil}, // NATS wildcards are valid ids
		{"devices/ünïcødé/signal", 1, -1, "ünïcødé", "", nil},
		{"devices/" + long[:256] + "/signal", 1, -1, long[:256], "", nil},
		{"devices", 1, -1, "", "", ErrNoIDLevel},
		{"devices/x", -1, -1, "", "", ErrNoIDLevel},
		{"devices//signal", 1, -1, "", "", ErrEmptyID},
		{"devices/", 1, -1, "", "", ErrEmptyID},
		{"devices/" + long + "/signal", 1, -1, "", "", ErrIDTooLong},
		{"devices/a\x01b/signal", 1, -1, "", "", ErrBadID},
		{"devices/a\x7fb/signal", 1, -1, "", "", ErrBadID},
		{"devices/a\u0085b/signal", 1, -1, "", "", ErrBadID}, // C1 control
		{"devices/a\xffb/signal", 1, -1, "", "", ErrBadID},
		{"devices/p\x00/d1", 2, 1, "", "", ErrBadType},
	} {
		id, typ, _, err := ParseTopic(tc.topic, tc.idLevel, tc.typeLvl, -1, 256)
		if id != tc.id || typ != tc.typ || !errors.Is(err, tc.err) {
			t.Errorf("ParseTopic(%q, %d, %d) = %q, %q, %v; want %q, %q, %v",
				tc.topic, tc.idLevel, tc.typeLvl, id, typ, err, tc.id, tc.typ, tc.err)
		}
	}
}

func TestParseTopicDoesNotAllocate(t *testing.T) {
	n := testing.AllocsPerRun(100, func() {
		ParseTopic("gw-17/pump/device-0042/signal", 2, 1, 0, 256)
	})
	if n != 0 {
		t.Errorf("ParseTopic allocates %v times per call, want 0", n)
	}
}

func TestParseTimestamp(t *testing.T) {
	for _, tc := range []struct {
		payload string
		want    time.Time
		err     error
	}{
		{`{"ts":1700000000123}`, time.UnixMilli(1700000000123), nil},
		{`{"ts":1700000000123.9,"v":1}`, time.UnixMilli(1700000000123), nil},
		{`{"ts":1.7e12}`, time.UnixMilli(1700000000000), nil},
		{`{"ts":"2023-11-14T22:13:20.123Z"}`, time.UnixMilli(1700000000123), nil},
		{`{"ts":"2023-11-14T23:13:20+01:00"}`, time.UnixMilli(1700000000000), nil},
		{``, time.Time{}, ErrBadPayload},
		{`not json`, time.Time{}, ErrBadPayload},
		{`[1,2]`, time.Time{}, ErrBadPayload},
		{`null`, time.Time{}, ErrBadPayload},
		{`{}`, time.Time{}, ErrMissingTimestamp},
		{`{"ts":null}`, time.Time{}, ErrMissingTimestamp},
		{`{"TS":1700000000123}`, time.Time{}, ErrMissingTimestamp},
		{`{"ts":"yesterday"}`, time.Time{}, ErrBadTimestamp},
		{`{"ts":true}`, time.Time{}, ErrBadTimestamp},
		{`{"ts":{}}`, time.Time{}, ErrBadTimestamp},
		{`{"ts":1e300}`, time.Time{}, ErrBadTimestamp},
	} {
		got, err := ParseTimestamp([]byte(tc.payload))
		if !got.Equal(tc.want) || !errors.Is(err, tc.err) {
			t.Errorf("ParseTimestamp(%s) = %v, %v; want %v, %v", tc.payload, got, err, tc.want, tc.err)
		}
	}
}

func TestClamp(t *testing.T) {
	now := time.UnixMilli(1_000_000)
	for _, tc := range []struct{ at, want time.Time }{
		{now.Add(time.Hour), now},
		{now.Add(-time.Second), now.Add(-time.Second)},
		{now.Add(-time.Hour), now.Add(-time.Minute)},
	} {
		if got := clamp(tc.at, now, time.Minute); !got.Equal(tc.want) {
			t.Errorf("clamp(%v) = %v, want %v", tc.at, got, tc.want)
		}
	}
}

func FuzzParseTopic(f *testing.F) {
	f.Add("devices/d1/signal", 1, -1, -1, 256)
	f.Add("devices/pump/d1/signal", 2, 1, -1, 256)
	f.Add("gw-17/pump/d1/signal", 2, 1, 0, 256)
	f.Add("devices//signal", 1, -1, 2, 256)
	f.Add("devices/a\x01/signal", 1, 0, 2, 8)
	f.Add("devices/a/g\x01", 1, -1, 2, 8)
	f.Add("/", 0, 1, 2, 0)
	f.Add("a/b/c/d/e", 4, 3, 0, 1)
	f.Fuzz(func(t *testing.T, topic string, idLevel, typeLevel, groupLevel, maxIDLen int) {
		// Keep levels meaningful.
		idLevel, typeLevel, groupLevel = idLevel%16, typeLevel%16, groupLevel%16
		id, typ, group, err := ParseTopic(topic, idLevel, typeLevel, groupLevel, maxIDLen)
		if err != nil {
			var ie *InvalidError
			if !errors.As(err, &ie) || ie.Reason == "" {
				t.Fatalf("error %v is not an InvalidError with a reason", err)
			}
			if id != "" || typ != "" || group != "" {
				t.Fatalf("got id %q, type %q, group %q with error %v; want all empty", id, typ, group, err)
			}
			return
		}
		limit := maxIDLen
		if limit <= 0 {
			limit = shard.DefaultMaxIDLen
		}
		if id == "" || len(id) > limit || !utf8.ValidString(id) || strings.ContainsRune(id, '/') {
			t.Fatalf("accepted id %q (limit %d)", id, limit)
		}
		if len(group) > limit {
			t.Fatalf("accepted group %q (limit %d)", group, limit)
		}
		for _, s := range []string{id, typ, group} {
			if !utf8.ValidString(s) || strings.IndexFunc(s, unicode.IsControl) >= 0 {
				t.Fatalf("accepted %q with control characters or bad UTF-8", s)
			}
		}
		levels := strings.Split(topic, "/")
		if levels[idLevel] != id {
			t.Fatalf("id %q, want level %d %q", id, idLevel, levels[idLevel])
		}
		if typeLevel >= 0 && typeLevel < len(levels) && levels[typeLevel] != typ {
			t.Fatalf("type %q, want level %d %q", typ, typeLevel, levels[typeLevel])
		}
		if groupLevel >= 0 && groupLevel < len(levels) && levels[groupLevel] != group {
			t.Fatalf("group %q, want level %d %q", group, groupLevel, levels[groupLevel])
		}
		if (groupLevel < 0 || groupLevel >= len(levels)) && group != "" {
			t.Fatalf("group %q from no group level (%d of %d levels)", group, groupLevel, len(levels))
		}
	})
}

func FuzzParseTimestamp(f *testing.F) {
	f.Add([]byte(`{"ts":1700000000123}`))
	f.Add([]byte(`{"ts":"2023-11-14T22:13:20.123Z"}`))
	f.Add([]byte(`{"ts":-1e18}`))
	f.Add([]byte(`{"ts":9223372036854775807}`))
	f.Add([]byte(`{"ts":"9999-12-31T23:59:59.999999999+23:59"}`))
	f.Add([]byte(`{"a":{"ts":1}}`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		ts, err := ParseTimestamp(payload)
		if err != nil {
			var ie *InvalidError
			if !errors.As(err, &ie) || ie.Reason == "" {
				t.Fatalf("error %v is not an InvalidError with a reason", err)
			}
			if !ts.IsZero() {
				t.Fatalf("got time %v with error %v", ts, err)
			}
			return
		}
		// Any accepted time round-trips as unix ms, and clamps into range.
		ms := ts.UnixMilli()
		again, err := ParseTimestamp([]byte(`{"ts":` + strconv.FormatInt(ms, 10) + `}`))
		if err != nil || again.UnixMilli() != ms {
			t.Fatalf("%d ms parsed back as %v, %v", ms, again, err)
		}
		now := time.UnixMilli(1_700_000_000_000)
		if c := clamp(ts, now, time.Minute); c.After(now) || c.Before(now.Add(-time.Minute)) {
			t.Fatalf("clamp(%v) = %v, outside [now-1m, now]", ts, c)
		}
	})
}
