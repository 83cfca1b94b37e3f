package ingest

import (
	"errors"
	"strings"
	"testing"
)

func TestParseDeclared(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Declared
		err  error
	}{
		{`{}`, Declared{}, nil},
		{`not json "ttd"`, Declared{}, nil},
		{`{"ttd": 2}`, Declared{Set: true, TTD: 2}, nil},
		{`{"ttd": -1}`, Declared{Set: true, TTD: -1}, nil},
		{`{"ttd": 0}`, Declared{Set: true}, nil},
		{`{"ttd": 2.0}`, Declared{Set: true, TTD: 2}, nil},
		{`{"ttd": null}`, Declared{}, nil},
		{`{"next": 1795830000000}`, Declared{Set: true, Next: 1795830000000}, nil},
		{`{"next": 1795830000000, "ttd": 5}`, Declared{Set: true, Next: 1795830000000}, nil},
		{`{"ttd": -2}`, Declared{}, ErrBadTTD},
		{`{"ttd": 1.5}`, Declared{}, ErrBadTTD},
		{`{"ttd": "2"}`, Declared{}, ErrBadTTD},
		{`{"ttd": 1e300}`, Declared{}, ErrBadTTD},
		{`{"next": -5}`, Declared{}, ErrBadNext},
		{`{"next": "soon"}`, Declared{}, ErrBadNext},
	} {
		got, err := ParseDeclared([]byte(c.in))
		if !errors.Is(err, c.err) || got != c.want {
			t.Errorf("%s: got %+v, %v; want %+v, %v", c.in, got, err, c.want, c.err)
		}
	}
}

func TestParseStatus(t *testing.T) {
	c := DefaultStatusConfig()
	for _, k := range []struct {
		in     string
		online bool
		err    error
	}{
		{"online", true, nil}, {"Online", true, nil}, {" OFFLINE\n", false, nil}, {"true", true, nil},
		{"0", false, nil}, {`{"state":"online"}`, true, nil}, {`{"state":"offline"}`, false, nil},
		{"", false, ErrBadStatus}, {"maybe", false, ErrBadStatus}, {`{"state":1}`, false, ErrBadStatus}, {`{`, false, ErrBadStatus},
	} {
		online, err := ParseStatus([]byte(k.in), &c)
		if !errors.Is(err, k.err) || (err == nil && online != k.online) {
			t.Errorf("%q: got %v, %v; want %v, %v", k.in, online, err, k.online, k.err)
		}
	}
}

func TestStatusConfigRefusals(t *testing.T) {
	c := DefaultStatusConfig()
	c.Topics = []string{"$share/g/devices/+/status"}
	c.Online = append(c.Online, "OFFLINE")
	c.TypeLevel = c.IDLevel
	err := c.Validate()
	for _, want := range []string{"give the filter itself", "both online and offline", "type_level must differ"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %v does not say %q", err, want)
		}
	}
}

// FuzzParseDeclared: any payload is read or refused with one of the
// declared refusals, never a panic; what is read is a declaration Hono
// defines.
func FuzzParseDeclared(f *testing.F) {
	for _, s := range []string{`{"ttd":2}`, `{"ttd":-1}`, `{"ttd":0}`, `{"next":1}`, `{"ttd":"x"}`, `"ttd"`, `{"next":1e400}`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParseDeclared(b)
		if err != nil {
			if !errors.Is(err, ErrBadTTD) && !errors.Is(err, ErrBadNext) {
				t.Fatalf("%q: refusal %v is not a declared refusal", b, err)
			}
			return
		}
		if d.Set && d.Next == 0 && d.TTD < -1 || d.Next < 0 {
			t.Fatalf("%q: read %+v", b, d)
		}
	})
}

// FuzzParseStatus: any status payload is online, offline or refused.
func FuzzParseStatus(f *testing.F) {
	c := DefaultStatusConfig()
	for _, s := range []string{"online", "offline", `{"state":"online"}`, `{"state":`, "", "\x00"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := ParseStatus(b, &c); err != nil && !errors.Is(err, ErrBadStatus) {
			t.Fatalf("%q: %v", b, err)
		}
	})
}
