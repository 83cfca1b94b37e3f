package sparkplug

import (
	"errors"
	"strings"
	"testing"
)

func TestParseTopic(t *testing.T) {
	cases := []struct {
		topic string
		want  Topic
		err   error
	}{
		{"spBv1.0/plant1/NBIRTH/edge1", Topic{Group: "plant1", Kind: NBirth, Node: "edge1"}, nil},
		{"spBv1.0/plant1/NDEATH/edge1", Topic{Group: "plant1", Kind: NDeath, Node: "edge1"}, nil},
		{"spBv1.0/plant1/NDATA/edge1", Topic{Group: "plant1", Kind: NData, Node: "edge1"}, nil},
		{"spBv1.0/plant1/NCMD/edge1", Topic{Group: "plant1", Kind: NCmd, Node: "edge1"}, nil},
		{"spBv1.0/plant1/DBIRTH/edge1/pump-7", Topic{Group: "plant1", Kind: DBirth, Node: "edge1", Device: "pump-7"}, nil},
		{"spBv1.0/plant1/DDEATH/edge1/pump-7", Topic{Group: "plant1", Kind: DDeath, Node: "edge1", Device: "pump-7"}, nil},
		{"spBv1.0/plant1/DDATA/edge1/pump-7", Topic{Group: "plant1", Kind: DData, Node: "edge1", Device: "pump-7"}, nil},
		{"spBv1.0/plant1/DCMD/edge1/pump-7", Topic{Group: "plant1", Kind: DCmd, Node: "edge1", Device: "pump-7"}, nil},
		{"spBv1.0/STATE/scada-1", Topic{Kind: State, Host: "scada-1"}, nil},
		{"spBv1.0/g.x/NDATA/n 1", Topic{Group: "g.x", Kind: NData, Node: "n 1"}, nil},

		{"", Topic{}, ErrNotSparkplug},
		{"spBv1.0", Topic{}, ErrNotSparkplug},
		{"spAv1.0/g/NBIRTH/n", Topic{}, ErrNotSparkplug},
		{"STATE/scada-1", Topic{}, ErrNotSparkplug}, // Sparkplug 2.2's host topic
		{"/spBv1.0/g/NBIRTH/n", Topic{}, ErrNotSparkplug},
		{"spBv1.0/g", Topic{}, ErrBadLevels},
		{"spBv1.0/g/NBIRTH", Topic{}, ErrBadLevels},
		{"spBv1.0/g/NBIRTH/n/d", Topic{}, ErrBadLevels},
		{"spBv1.0/g/DBIRTH/n", Topic{}, ErrBadLevels},
		{"spBv1.0/g/DDATA/n/d/x", Topic{}, ErrBadLevels},
		{"spBv1.0/g/DDATA/n/d/x/y/z", Topic{}, ErrBadLevels},
		{"spBv1.0/STATE", Topic{}, ErrBadLevels},
		{"spBv1.0/STATE/h/x", Topic{}, ErrBadLevels},
		{"spBv1.0/STATE/NBIRTH/n", Topic{}, ErrBadLevels}, // STATE is no group
		{"spBv1.0/g/nbirth/n", Topic{}, ErrBadKind},
		{"spBv1.0/g/STATE/n", Topic{}, ErrBadKind},
		{"spBv1.0/g/+/n", Topic{}, ErrBadKind},
		{"spBv1.0//NBIRTH/n", Topic{}, ErrEmptyLevel},
		{"spBv1.0/g/NBIRTH/", Topic{}, ErrEmptyLevel},
		{"spBv1.0/g/DBIRTH/n/", Topic{}, ErrEmptyLevel},
		{"spBv1.0/g/DBIRTH//d", Topic{}, ErrEmptyLevel},
		{"spBv1.0/STATE/", Topic{}, ErrEmptyLevel},
		{"spBv1.0/+/NBIRTH/n", Topic{}, ErrWildcard},
		{"spBv1.0/g/NBIRTH/#", Topic{}, ErrWildcard},
		{"spBv1.0/g/DDATA/n/a+b", Topic{}, ErrWildcard},
		{"spBv1.0/STATE/#", Topic{}, ErrWildcard},
	}
	for _, c := range cases {
		got, err := ParseTopic(c.topic)
		if !errors.Is(err, c.err) || got != c.want {
			t.Errorf("ParseTopic(%q) = %+v, %v; want %+v, %v", c.topic, got, err, c.want, c.err)
		}
		if err == nil && got.String() != c.topic {
			t.Errorf("ParseTopic(%q).String() = %q", c.topic, got.String())
		}
	}
}

func TestParseTopicAllocatesNothing(t *testing.T) {
	for _, topic := range []string{"spBv1.0/plant1/DDATA/edge1/pump-7", "spBv1.0/g/DDATA/n", "spBv1.0/g/+/n"} {
		if n := testing.AllocsPerRun(100, func() { _, _ = ParseTopic(topic) }); n != 0 {
			t.Errorf("ParseTopic(%q) allocates %v times", topic, n)
		}
	}
}

func TestRefusalsAreOneLine(t *testing.T) {
	for _, e := range Refusals {
		if e.Reason == "" || e.Msg == "" || strings.ContainsAny(e.Msg, "\n") || strings.Contains(e.Msg, "sparkplug:") {
			t.Errorf("refusal %+v", e)
		}
	}
}

func FuzzParseTopic(f *testing.F) {
	for _, s := range []string{
		"spBv1.0/plant1/NBIRTH/edge1", "spBv1.0/plant1/DDATA/edge1/pump-7", "spBv1.0/STATE/scada-1",
		"spBv1.0/g/DBIRTH/n/", "spBv1.0//NDATA/n", "spBv1.0/+/NDEATH/#", "spBv1.0/g/XDATA/n", "spBv1.0",
		"spBv1.0/STATE/h/x", "spBv1.0/g/DCMD/n/d/e", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, topic string) {
		got, err := ParseTopic(topic)
		if err != nil {
			var ie *InvalidError
			if !errors.As(err, &ie) || got != (Topic{}) {
				t.Fatalf("ParseTopic(%q) = %+v, %v", topic, got, err)
			}
			return
		}
		if got.String() != topic {
			t.Fatalf("ParseTopic(%q) = %+v, which reads back as %q", topic, got, got.String())
		}
		ids := []string{got.Host}
		if got.Kind != State {
			ids = []string{got.Group, got.Node}
			if got.Kind.Device() {
				ids = append(ids, got.Device)
			} else if got.Device != "" {
				t.Fatalf("ParseTopic(%q): device %q on a node type", topic, got.Device)
			}
		}
		for _, id := range ids {
			if id == "" || strings.ContainsAny(id, "+#/") {
				t.Fatalf("ParseTopic(%q) accepted id %q", topic, id)
			}
		}
	})
}
