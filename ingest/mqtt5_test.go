package ingest

import (
	"errors"
	"testing"
)

func TestMatches(t *testing.T) {
	for _, c := range []struct {
		filter, topic string
		want          bool
	}{
		{"devices/+/signal", "devices/a/signal", true},
		{"devices/+/signal", "devices/a/b/signal", false},
		{"devices/+/signal", "devices//signal", true},
		{"devices/#", "devices", true},
		{"devices/#", "devices/a/b", true},
		{"#", "devices/a", true},
		{"#", "$SYS/broker/uptime", false},
		{"$SYS/broker/uptime", "$SYS/broker/uptime", true},
		{"+/broker/uptime", "$SYS/broker/uptime", false},
		{"$share/g/devices/+/signal", "devices/a/signal", true},
		{"$share/g/devices/+/signal", "g/devices/a/signal", false},
		{"sigwatch/probe/x", "sigwatch/probe/x", true},
		{"sigwatch/probe/x", "sigwatch/probe/y", false},
	} {
		if got := matches(c.filter, c.topic); got != c.want {
			t.Errorf("matches(%q, %q) = %v, want %v", c.filter, c.topic, got, c.want)
		}
	}
}

func props(kv ...string) func(string) (string, bool) {
	return func(key string) (string, bool) {
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i] == key {
				return kv[i+1], true
			}
		}
		return "", false
	}
}

func TestParseDeclaredProperties(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want Declared
		err  error
	}{
		{nil, Declared{}, nil},
		{[]string{"other", "1"}, Declared{}, nil},
		{[]string{"ttd", "2"}, Declared{Set: true, TTD: 2}, nil},
		{[]string{"ttd", " -1 "}, Declared{Set: true, TTD: -1}, nil},
		{[]string{"ttd", "0"}, Declared{Set: true}, nil},
		{[]string{"next", "1795830000000", "ttd", "5"}, Declared{Set: true, Next: 1795830000000}, nil},
		{[]string{"ttd", "-2"}, Declared{}, ErrBadTTDProperty},
		{[]string{"ttd", "1.5"}, Declared{}, ErrBadTTDProperty},
		{[]string{"ttd", ""}, Declared{}, ErrBadTTDProperty},
		{[]string{"ttd", "99999999999999999999"}, Declared{}, ErrBadTTDProperty},
		{[]string{"next", "soon"}, Declared{}, ErrBadNextProperty},
		{[]string{"next", "0"}, Declared{}, ErrBadNextProperty},
	} {
		got, err := ParseDeclaredProperties(props(c.in...))
		if !errors.Is(err, c.err) || got != c.want {
			t.Errorf("%q: got %+v, %v; want %+v, %v", c.in, got, err, c.want, c.err)
		}
	}
}

func FuzzParseDeclaredProperties(f *testing.F) {
	for _, s := range []string{"2", "-1", "0", "1795830000000", "x", " 7 ", "-9223372036854775808"} {
		f.Add("ttd", s)
		f.Add("next", s)
	}
	f.Fuzz(func(t *testing.T, key, value string) {
		d, err := ParseDeclaredProperties(props(key, value))
		switch {
		case err != nil && d != (Declared{}):
			t.Fatalf("%s=%q: refused but declared %+v", key, value, d)
		case err == nil && d.Set && (d.TTD < -1 || d.Next < 0 || d.Next != 0 && key != "next"):
			t.Fatalf("%s=%q: declared %+v", key, value, d)
		case err == nil && d.Set != (key == "ttd" || key == "next"):
			t.Fatalf("%s=%q: set %v", key, value, d.Set)
		}
	})
}
