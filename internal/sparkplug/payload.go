package sparkplug

import (
	"math"

	"google.golang.org/protobuf/proto"
)

// BdSeqMetric is the name of the metric that ties an NBIRTH to the NDEATH
// set as the same connection's will.
const BdSeqMetric = "bdSeq"

// ScanRateMetric is the node control metric by which an edge node says, in
// its NBIRTH, that it publishes its data every so many milliseconds.
const ScanRateMetric = "Node Control/Scan Rate"

// Info is what liveness needs of a Sparkplug B payload.
type Info struct {
	Timestamp int64 // ms since the epoch at sending; 0 if absent
	Seq       int64 // the message's seq; -1 if absent (an NDEATH has none)
	BdSeq     int64 // the bdSeq metric's value, when HasBdSeq
	HasBdSeq  bool
	Metrics   int   // how many metrics the payload carries
	ScanRate  int64 // the Node Control/Scan Rate metric, ms; 0 if absent or not a positive integer
}

// Decode reads a Sparkplug B payload. It refuses bytes that are not the
// protobuf (ErrBadPayload), a bdSeq metric that is not a non-negative
// integer (ErrBadBdSeq), and a timestamp or seq past int64 (ErrBadNumber);
// all three have the reason bad_sparkplug_payload. Seq is not held to
// 0..255: a node that counts further still sends a signal.
func Decode(b []byte) (Info, error) {
	var p Payload
	// Unknown fields are third-party extensions: dropped, not kept alive.
	if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, &p); err != nil {
		return Info{}, ErrBadPayload
	}
	info := Info{Seq: -1, Metrics: len(p.Metrics)}
	if p.Timestamp != nil {
		if *p.Timestamp > math.MaxInt64 {
			return Info{}, ErrBadNumber
		}
		info.Timestamp = int64(*p.Timestamp)
	}
	if p.Seq != nil {
		if *p.Seq > math.MaxInt64 {
			return Info{}, ErrBadNumber
		}
		info.Seq = int64(*p.Seq)
	}
	for _, m := range p.Metrics {
		switch m.GetName() {
		case BdSeqMetric:
			if info.HasBdSeq {
				continue // the first one counts
			}
			v, ok := intValue(m)
			if !ok {
				return Info{}, ErrBadBdSeq
			}
			info.BdSeq, info.HasBdSeq = v, true
		case ScanRateMetric:
			// A scan rate that cannot be read says nothing: the node is
			// then taken to report by exception.
			if v, ok := intValue(m); ok && info.ScanRate == 0 {
				info.ScanRate = v
			}
		}
	}
	return info, nil
}

// intValue reads an integer metric's value as the specification stores it:
// 8-, 16- and 32-bit types in int_value (signed ones as two's complement),
// 64-bit ones in long_value. An untyped metric is read as unsigned. It
// refuses a null, a negative value, one past int64 and a non-integer.
func intValue(m *Payload_Metric) (int64, bool) {
	if m.GetIsNull() {
		return 0, false
	}
	dt := DataType(m.GetDatatype())
	var v int64
	switch x := m.Value.(type) {
	case *Payload_Metric_IntValue:
		switch dt {
		case DataType_Int8:
			v = int64(int8(x.IntValue))
		case DataType_Int16:
			v = int64(int16(x.IntValue))
		case DataType_Int32:
			v = int64(int32(x.IntValue))
		case DataType_Unknown, DataType_UInt8, DataType_UInt16, DataType_UInt32, DataType_Int64, DataType_UInt64:
			v = int64(x.IntValue)
		default:
			return 0, false
		}
	case *Payload_Metric_LongValue:
		switch dt {
		case DataType_Unknown, DataType_Int8, DataType_Int16, DataType_Int32, DataType_Int64,
			DataType_UInt8, DataType_UInt16, DataType_UInt32, DataType_UInt64:
			if x.LongValue > math.MaxInt64 {
				return 0, false
			}
			v = int64(x.LongValue)
		default:
			return 0, false
		}
	default:
		return 0, false
	}
	return v, v >= 0
}

// BirthPayload is an NBIRTH: seq, the timestamp ts (ms; omitted when not
// above 0), the bdSeq metric, then one Int64 metric of value 0 per name.
func BirthPayload(bdSeq uint64, seq uint64, ts int64, metrics ...string) []byte {
	p := payload(ts)
	p.Seq = proto.Uint64(seq)
	p.Metrics = make([]*Payload_Metric, 0, 1+len(metrics))
	p.Metrics = append(p.Metrics, bdSeqMetric(bdSeq, p.Timestamp))
	p.Metrics = appendMetrics(p.Metrics, p.Timestamp, metrics)
	return marshal(p)
}

// PeriodicBirthPayload is an NBIRTH whose node says it publishes its data
// every scanRate ms (the Node Control/Scan Rate metric).
func PeriodicBirthPayload(bdSeq uint64, seq uint64, ts, scanRate int64, metrics ...string) []byte {
	p := payload(ts)
	p.Seq = proto.Uint64(seq)
	p.Metrics = []*Payload_Metric{bdSeqMetric(bdSeq, p.Timestamp), {
		Name:      proto.String(ScanRateMetric),
		Timestamp: p.Timestamp,
		Datatype:  proto.Uint32(uint32(DataType_Int64)),
		Value:     &Payload_Metric_LongValue{LongValue: uint64(max(scanRate, 0))},
	}}
	p.Metrics = appendMetrics(p.Metrics, p.Timestamp, metrics)
	return marshal(p)
}

// DeviceBirthPayload is a DBIRTH: like BirthPayload without bdSeq, which
// only the node's messages carry.
func DeviceBirthPayload(seq uint64, ts int64, metrics ...string) []byte {
	p := payload(ts)
	p.Seq = proto.Uint64(seq)
	p.Metrics = appendMetrics(make([]*Payload_Metric, 0, len(metrics)), p.Timestamp, metrics)
	return marshal(p)
}

// DeathPayload is an NDEATH: the bdSeq metric and the timestamp, no seq.
// A node sets it as its will when it connects.
func DeathPayload(bdSeq uint64, ts int64) []byte {
	p := payload(ts)
	p.Metrics = []*Payload_Metric{bdSeqMetric(bdSeq, p.Timestamp)}
	return marshal(p)
}

// DataPayload is an NDATA, DDATA or DDEATH: seq and the timestamp, no
// metrics.
func DataPayload(seq uint64, ts int64) []byte {
	p := payload(ts)
	p.Seq = proto.Uint64(seq)
	return marshal(p)
}

func payload(ts int64) *Payload {
	p := &Payload{}
	if ts > 0 {
		p.Timestamp = proto.Uint64(uint64(ts))
	}
	return p
}

func bdSeqMetric(bdSeq uint64, ts *uint64) *Payload_Metric {
	return &Payload_Metric{
		Name:      proto.String(BdSeqMetric),
		Timestamp: ts,
		Datatype:  proto.Uint32(uint32(DataType_UInt64)),
		Value:     &Payload_Metric_LongValue{LongValue: bdSeq},
	}
}

func appendMetrics(ms []*Payload_Metric, ts *uint64, names []string) []*Payload_Metric {
	for _, name := range names {
		ms = append(ms, &Payload_Metric{
			Name:      proto.String(name),
			Timestamp: ts,
			Datatype:  proto.Uint32(uint32(DataType_Int64)),
			Value:     &Payload_Metric_LongValue{},
		})
	}
	return ms
}

func marshal(p *Payload) []byte {
	b, err := proto.Marshal(p)
	if err != nil {
		// Payload has no required fields, so marshalling cannot fail.
		panic("sparkplug: " + err.Error())
	}
	return b
}
