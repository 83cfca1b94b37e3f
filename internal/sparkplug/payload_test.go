package sparkplug

import (
	"errors"
	"math"
	"testing"

	"google.golang.org/protobuf/proto"
)

func metric(name string, dt DataType, v isPayload_Metric_Value) *Payload_Metric {
	return &Payload_Metric{Name: proto.String(name), Datatype: proto.Uint32(uint32(dt)), Value: v}
}

func marshalT(t testing.TB, p *Payload) []byte {
	t.Helper()
	b, err := proto.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecode(t *testing.T) {
	long := func(v uint64) isPayload_Metric_Value { return &Payload_Metric_LongValue{LongValue: v} }
	int32v := func(v uint32) isPayload_Metric_Value { return &Payload_Metric_IntValue{IntValue: v} }
	cases := []struct {
		name string
		p    *Payload
		want Info
		err  error
	}{
		{"empty", &Payload{}, Info{Seq: -1}, nil},
		{"data", &Payload{Timestamp: proto.Uint64(1700000000123), Seq: proto.Uint64(7)},
			Info{Timestamp: 1700000000123, Seq: 7}, nil},
		{"birth", &Payload{Timestamp: proto.Uint64(5), Seq: proto.Uint64(0), Metrics: []*Payload_Metric{
			metric("temp", DataType_Double, &Payload_Metric_DoubleValue{DoubleValue: 1.5}),
			metric("bdSeq", DataType_UInt64, long(3))}},
			Info{Timestamp: 5, Seq: 0, BdSeq: 3, HasBdSeq: true, Metrics: 2}, nil},
		{"bdSeq as Int32 in int_value", &Payload{Metrics: []*Payload_Metric{metric("bdSeq", DataType_Int32, int32v(9))}},
			Info{Seq: -1, BdSeq: 9, HasBdSeq: true, Metrics: 1}, nil},
		{"bdSeq as UInt8", &Payload{Metrics: []*Payload_Metric{metric("bdSeq", DataType_UInt8, int32v(255))}},
			Info{Seq: -1, BdSeq: 255, HasBdSeq: true, Metrics: 1}, nil},
		{"bdSeq as Int64", &Payload{Metrics: []*Payload_Metric{metric("bdSeq", DataType_Int64, long(1<<40))}},
			Info{Seq: -1, BdSeq: 1 << 40, HasBdSeq: true, Metrics: 1}, nil},
		{"bdSeq untyped", &Payload{Metrics: []*Payload_Metric{{Name: proto.String("bdSeq"), Value: long(2)}}},
			Info{Seq: -1, BdSeq: 2, HasBdSeq: true, Metrics: 1}, nil},
		{"the first bdSeq counts", &Payload{Metrics: []*Payload_Metric{
			metric("bdSeq", DataType_UInt64, long(1)), metric("bdSeq", DataType_UInt64, long(2))}},
			Info{Seq: -1, BdSeq: 1, HasBdSeq: true, Metrics: 2}, nil},
		{"a metric by alias is not bdSeq", &Payload{Metrics: []*Payload_Metric{{Alias: proto.Uint64(1), Value: long(4)}}},
			Info{Seq: -1, Metrics: 1}, nil},
		{"BDSEQ is another metric", &Payload{Metrics: []*Payload_Metric{metric("BDSEQ", DataType_UInt64, long(4))}},
			Info{Seq: -1, Metrics: 1}, nil},

		{"negative Int8 bdSeq", &Payload{Metrics: []*Payload_Metric{metric("bdSeq", DataType_Int8, int32v(0xff))}}, Info{}, ErrBadBdSeq},
		{"negative Int64 bdSeq", &Payload{Metrics: []*Payload_Metric{metric("bdSeq", DataType_Int64, long(math.MaxUint64))}}, Info{}, ErrBadBdSeq},
		{"huge UInt64 bdSeq", &Payload{Metrics: []*Payload_Metric{metric("bdSeq", DataType_UInt64, long(math.MaxInt64+1))}}, Info{}, ErrBadBdSeq},
		{"string bdSeq", &Payload{Metrics: []*Payload_Metric{metric("bdSeq", DataType_String, &Payload_Metric_StringValue{StringValue: "1"})}}, Info{}, ErrBadBdSeq},
		{"double bdSeq", &Payload{Metrics: []*Payload_Metric{metric("bdSeq", DataType_Double, &Payload_Metric_DoubleValue{DoubleValue: 1})}}, Info{}, ErrBadBdSeq},
		{"a float type in long_value", &Payload{Metrics: []*Payload_Metric{metric("bdSeq", DataType_Float, long(1))}}, Info{}, ErrBadBdSeq},
		{"null bdSeq", &Payload{Metrics: []*Payload_Metric{{Name: proto.String("bdSeq"), Datatype: proto.Uint32(8), IsNull: proto.Bool(true)}}}, Info{}, ErrBadBdSeq},
		{"bdSeq without a value", &Payload{Metrics: []*Payload_Metric{{Name: proto.String("bdSeq"), Datatype: proto.Uint32(8)}}}, Info{}, ErrBadBdSeq},
		{"timestamp past int64", &Payload{Timestamp: proto.Uint64(math.MaxInt64 + 1)}, Info{}, ErrBadNumber},
		{"seq past int64", &Payload{Seq: proto.Uint64(math.MaxUint64)}, Info{}, ErrBadNumber},
	}
	for _, c := range cases {
		got, err := Decode(marshalT(t, c.p))
		if !errors.Is(err, c.err) || got != c.want {
			t.Errorf("%s: Decode = %+v, %v; want %+v, %v", c.name, got, err, c.want, c.err)
		}
	}
	for _, b := range [][]byte{{0xff}, {0x08}, {0x12, 0x05, 0x0a}, []byte(`{"ts":1}`), {0x0a, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}} {
		if got, err := Decode(b); !errors.Is(err, ErrBadPayload) || got != (Info{}) {
			t.Errorf("Decode(%x) = %+v, %v; want %v", b, got, err, ErrBadPayload)
		}
	}
	if ErrBadPayload.Reason != "bad_sparkplug_payload" || ErrBadBdSeq.Reason != ErrBadPayload.Reason || ErrBadNumber.Reason != ErrBadPayload.Reason {
		t.Error("every malformed payload must have the reason bad_sparkplug_payload")
	}
}

func TestEncodersRoundTrip(t *testing.T) {
	cases := []struct {
		name string
		b    []byte
		want Info
	}{
		{"NBIRTH", BirthPayload(3, 0, 1700000000000, "temp", "rpm"), Info{Timestamp: 1700000000000, Seq: 0, BdSeq: 3, HasBdSeq: true, Metrics: 3}},
		{"DBIRTH", DeviceBirthPayload(1, 1700000000000, "temp"), Info{Timestamp: 1700000000000, Seq: 1, Metrics: 1}},
		{"periodic NBIRTH", PeriodicBirthPayload(2, 0, 1700000000000, 5000, "temp"), Info{Timestamp: 1700000000000, Seq: 0, BdSeq: 2, HasBdSeq: true, Metrics: 3, ScanRate: 5000}},
		{"NDEATH", DeathPayload(3, 1700000000000), Info{Timestamp: 1700000000000, Seq: -1, BdSeq: 3, HasBdSeq: true, Metrics: 1}},
		{"DDATA", DataPayload(255, 1), Info{Timestamp: 1, Seq: 255}},
		{"no timestamp", DataPayload(4, 0), Info{Seq: 4}},
		{"a negative timestamp is left out", DeathPayload(0, -5), Info{Seq: -1, HasBdSeq: true, Metrics: 1}},
	}
	for _, c := range cases {
		if got, err := Decode(c.b); err != nil || got != c.want {
			t.Errorf("%s: Decode = %+v, %v; want %+v", c.name, got, err, c.want)
		}
	}
}

func TestStatePayload(t *testing.T) {
	if got := string(StatePayload(true, 1700000000123)); got != `{"online":true,"timestamp":1700000000123}` {
		t.Errorf("StatePayload(true) = %s", got)
	}
	if got := string(StatePayload(false, 0)); got != `{"online":false,"timestamp":0}` {
		t.Errorf("StatePayload(false) = %s", got)
	}
	for _, c := range []struct {
		in     string
		online bool
		ts     int64
		err    error
	}{
		{`{"online":true,"timestamp":5}`, true, 5, nil},
		{`{"timestamp":6,"online":false,"x":1}`, false, 6, nil},
		{`{"online":true}`, false, 0, ErrBadState},
		{`{"timestamp":5}`, false, 0, ErrBadState},
		{`{"online":"yes","timestamp":5}`, false, 0, ErrBadState},
		{`OFFLINE`, false, 0, ErrBadState}, // Sparkplug 2.2's STATE
		{``, false, 0, ErrBadState},
	} {
		online, ts, err := DecodeState([]byte(c.in))
		if online != c.online || ts != c.ts || !errors.Is(err, c.err) {
			t.Errorf("DecodeState(%s) = %v, %d, %v", c.in, online, ts, err)
		}
	}
}

// FuzzDecode feeds Decode arbitrary bytes (it must refuse them with an
// InvalidError or read them, never panic) and checks that what the
// encoders make decodes to what they were given.
func FuzzDecode(f *testing.F) {
	f.Add(BirthPayload(0, 0, 1700000000000, "temp"), uint64(0), uint64(0), int64(1700000000000), "temp")
	f.Add(DeathPayload(7, 1), uint64(7), uint64(3), int64(1), "")
	f.Add(DataPayload(255, 0), uint64(math.MaxInt64), uint64(255), int64(-1), "bdSeq")
	f.Add([]byte{0x12, 0x05, 0x0a}, uint64(math.MaxUint64), uint64(math.MaxUint64), int64(math.MaxInt64), "x\xff")
	f.Add([]byte(`{"online":true,"timestamp":5}`), uint64(1), uint64(256), int64(math.MinInt64), "a")
	f.Fuzz(func(t *testing.T, b []byte, bdSeq, seq uint64, ts int64, name string) {
		if info, err := Decode(b); err != nil {
			var ie *InvalidError
			if !errors.As(err, &ie) || ie.Reason != "bad_sparkplug_payload" || info != (Info{}) {
				t.Fatalf("Decode(%x) = %+v, %v", b, info, err)
			}
		} else if info.Seq < -1 || info.BdSeq < 0 || info.Timestamp < 0 || (info.BdSeq != 0 && !info.HasBdSeq) {
			t.Fatalf("Decode(%x) = %+v", b, info)
		}

		wantTS := max(ts, 0)
		wantSeq, seqErr := int64(seq), error(nil)
		if seq > math.MaxInt64 {
			wantSeq, seqErr = 0, ErrBadNumber
		}
		wantBd, bdErr := int64(bdSeq), error(nil)
		if bdSeq > math.MaxInt64 {
			wantBd, bdErr = 0, ErrBadBdSeq
		}
		check := func(what string, b []byte, want Info, wantErr error) {
			t.Helper()
			got, err := Decode(b)
			if wantErr != nil {
				want = Info{}
			}
			if got != want || !errors.Is(err, wantErr) {
				t.Fatalf("%s: Decode = %+v, %v; want %+v, %v", what, got, err, want, wantErr)
			}
		}
		// A named metric may itself be called bdSeq: it comes after the
		// real one, and the first counts.
		birthErr := seqErr // Decode reads seq before the metrics
		if birthErr == nil {
			birthErr = bdErr
		}
		check("birth", BirthPayload(bdSeq, seq, ts, name), Info{Timestamp: wantTS, Seq: wantSeq, BdSeq: wantBd, HasBdSeq: true, Metrics: 2}, birthErr)
		check("death", DeathPayload(bdSeq, ts), Info{Timestamp: wantTS, Seq: -1, BdSeq: wantBd, HasBdSeq: true, Metrics: 1}, bdErr)
		check("data", DataPayload(seq, ts), Info{Timestamp: wantTS, Seq: wantSeq}, seqErr)
		dbirth := Info{Timestamp: wantTS, Seq: wantSeq, Metrics: 1}
		if name == BdSeqMetric {
			dbirth.BdSeq, dbirth.HasBdSeq = 0, true
		}
		check("device birth", DeviceBirthPayload(seq, ts, name), dbirth, seqErr)
	})
}
