package sparkplug

import "strings"

// Namespace is the first level of every Sparkplug B topic.
const Namespace = "spBv1.0"

// Kind is a Sparkplug B message type.
type Kind uint8

// The message types. KindNone is the zero value, never a parsed topic's.
const (
	KindNone Kind = iota
	NBirth
	NDeath
	DBirth
	DDeath
	NData
	DData
	NCmd
	DCmd
	State // a host application's spBv1.0/STATE/<host_id>
)

var kindNames = [...]string{"", "NBIRTH", "NDEATH", "DBIRTH", "DDEATH", "NDATA", "DDATA", "NCMD", "DCMD", "STATE"}

// String is the type as it stands in a topic.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// Device reports whether k is about a device (D*), whose topic has a
// device level.
func (k Kind) Device() bool { return k == DBirth || k == DDeath || k == DData || k == DCmd }

// kindOf returns the Kind named s, or KindNone.
func kindOf(s string) Kind {
	for k := NBirth; k < State; k++ {
		if kindNames[k] == s {
			return k
		}
	}
	return KindNone
}

// Topic is a parsed Sparkplug B topic. Group, Node and Device are set for
// the node and device types (Device only for D*); Host only for State.
type Topic struct {
	Group  string
	Kind   Kind
	Node   string
	Device string
	Host   string
}

// ParseTopic parses spBv1.0/<group>/<type>/<edge_node>[/<device>] and
// spBv1.0/STATE/<host_id>. A device level is required for the D* types and
// refused for the N* ones; every id is non-empty and free of '+' and '#'
// ('/' cannot be inside one: it would be another level). A group named
// STATE is refused, as Sparkplug 3.0 reserves it for the host topic.
//
// ParseTopic does not allocate: the ids share topic's memory.
func ParseTopic(topic string) (Topic, error) {
	ns, rest, ok := strings.Cut(topic, "/")
	if ns != Namespace || !ok {
		return Topic{}, ErrNotSparkplug
	}
	var parts [5]string // group, type, node, device, and whatever is past them
	n := 0
	for n < len(parts) {
		seg, tail, more := strings.Cut(rest, "/")
		parts[n] = seg
		n++
		if !more {
			break
		}
		rest = tail
	}
	if parts[0] == "STATE" {
		if n != 2 {
			return Topic{}, ErrBadLevels
		}
		if err := checkID(parts[1]); err != nil {
			return Topic{}, err
		}
		return Topic{Kind: State, Host: parts[1]}, nil
	}
	if n < 2 {
		return Topic{}, ErrBadLevels
	}
	kind := kindOf(parts[1])
	if kind == KindNone {
		return Topic{}, ErrBadKind
	}
	want := 3
	if kind.Device() {
		want = 4
	}
	if n != want {
		return Topic{}, ErrBadLevels
	}
	ids := [3]string{parts[0], parts[2], parts[3]}
	for _, id := range ids[:want-1] {
		if err := checkID(id); err != nil {
			return Topic{}, err
		}
	}
	return Topic{Group: parts[0], Kind: kind, Node: parts[2], Device: parts[3]}, nil
}

// checkID refuses an empty id or one holding a wildcard.
func checkID(id string) error {
	switch {
	case id == "":
		return ErrEmptyLevel
	case strings.ContainsAny(id, "+#"):
		return ErrWildcard
	}
	return nil
}

// String is the topic t was parsed from.
func (t Topic) String() string {
	switch {
	case t.Kind == State:
		return Namespace + "/STATE/" + t.Host
	case t.Kind.Device():
		return Namespace + "/" + t.Group + "/" + t.Kind.String() + "/" + t.Node + "/" + t.Device
	default:
		return Namespace + "/" + t.Group + "/" + t.Kind.String() + "/" + t.Node
	}
}
