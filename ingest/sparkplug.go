package ingest

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sigwatch/sigwatch/internal/sparkplug"
	"github.com/sigwatch/sigwatch/shard"
)

// SparkplugConfig is the mqtt.sparkplug section: Sparkplug B edge nodes
// and their devices, watched by their births and deaths. A node
// <group>/<node> and its devices <group>/<node>/<device> are sigwatch
// devices in the group <group>/<node>, so a node's death is one storm.
// Sparkplug devices report by exception: a birth arms them until further
// notice (thresholds.max_declared) and their data resets nothing, unless
// their type is listed in Periodic, where a birth and every NDATA/DDATA
// count as signals under the type's threshold.
type SparkplugConfig struct {
	Enabled    bool     `yaml:"enabled"`
	HostID     string   `yaml:"host_id"`     // STATE is published as this host application; "": none
	NodeType   string   `yaml:"node_type"`   // the type of edge nodes
	DeviceType string   `yaml:"device_type"` // the type of their devices
	Periodic   []string `yaml:"periodic"`    // types whose data is periodic
}

// DefaultSparkplugConfig is the mqtt.sparkplug section when nothing is
// configured.
func DefaultSparkplugConfig() SparkplugConfig {
	return SparkplugConfig{HostID: "sigwatch", NodeType: "sparkplug-node", DeviceType: "sparkplug-device"}
}

// Validate refuses Sparkplug settings that cannot work.
func (c SparkplugConfig) Validate() error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	if c.NodeType == "" || c.DeviceType == "" {
		errs = append(errs, errors.New("mqtt.sparkplug.node_type and mqtt.sparkplug.device_type must not be empty"))
	}
	if _, err := sparkplug.ParseTopic(sparkplugStateTopic(c.HostID)); c.HostID != "" && err != nil {
		errs = append(errs, errors.New("mqtt.sparkplug.host_id must be one topic level without '+', '#' or '/'"))
	}
	return errors.Join(errs...)
}

// sparkplugFilter is what ingest subscribes for Sparkplug.
const sparkplugFilter = sparkplug.Namespace + "/#"

func sparkplugStateTopic(host string) string { return sparkplug.Namespace + "/STATE/" + host }

// sparkplugRefusals are the Sparkplug refusals as ingest's own, by reason,
// so that each has its counter.
var sparkplugRefusals = func() map[string]*InvalidError {
	m := map[string]*InvalidError{}
	for _, e := range sparkplug.Refusals {
		if _, ok := m[e.Reason]; !ok {
			m[e.Reason] = &InvalidError{Reason: e.Reason, Msg: "sparkplug: " + e.Msg}
		}
	}
	return m
}()

// sparkplugRefusal maps a refusal of the sparkplug package to ingest's.
func sparkplugRefusal(err error) error {
	var e *sparkplug.InvalidError
	if errors.As(err, &e) {
		if r, ok := sparkplugRefusals[e.Reason]; ok {
			return &InvalidError{Reason: r.Reason, Msg: "sparkplug: " + e.Msg}
		}
	}
	return err
}

// ErrBirthWithoutBdSeq refuses an NBIRTH whose death could never be matched.
var ErrBirthWithoutBdSeq = &InvalidError{Reason: "bad_sparkplug_payload", Msg: "sparkplug: NBIRTH has no bdSeq metric"}

// nodeStateScript keeps the bdSeq of each edge node's current birth: a
// birth records it, a death counts only if it carries it (Sparkplug 3.0:
// a death of an earlier connection, or a second copy, changes nothing). A
// birth also records the node's scan rate (field "<node>#rate").
//
// KEYS[1]: the HASH of the node's registry partition (leaf spb)
// ARGV[1]: node id; ARGV[2]: birth or death; ARGV[3]: bdSeq; ARGV[4]:
// the scan rate, ms (0: none)
// Returns: 1 if the message counts, else 0.
var nodeStateScript = shard.NewScript(`
if ARGV[2] == 'birth' then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3], ARGV[1] .. '#rate', ARGV[4])
  return 1
end
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[3] then
  redis.call('HSET', KEYS[1], ARGV[1], 'dead:' .. ARGV[3])
  return 1
end
return 0`)

const sparkplugLeaf = "spb"

// onSparkplug handles one message of the Sparkplug namespace; hi caps its
// receive time (see onMessage).
func (s *source) onSparkplug(m mqtt.Message, now, hi time.Time) {
	c := &s.opts.Sparkplug
	t, err := sparkplug.ParseTopic(m.Topic())
	var info sparkplug.Info
	if err == nil {
		switch t.Kind {
		case sparkplug.State:
			s.onHostState(t.Host, m)
			return
		case sparkplug.NCmd, sparkplug.DCmd:
			m.Ack()
			return
		}
		info, err = sparkplug.Decode(m.Payload())
	}
	if err == nil && t.Kind == sparkplug.NBirth && !info.HasBdSeq {
		err = ErrBirthWithoutBdSeq
	}
	node := t.Group + "/" + t.Node
	id := node
	if t.Kind.Device() {
		id += "/" + t.Device
	}
	if err == nil {
		err = shard.CheckID(id, s.opts.MaxIDLen)
	}
	if err != nil {
		s.dead.refuse(sparkplugRefusal(err), m.Topic(), m, now)
		return
	}
	typ := c.DeviceType
	if !t.Kind.Device() {
		typ = c.NodeType
	}
	periodic := slices.Contains(c.Periodic, typ)
	// A node that says it scans every rate ms is periodic too: it and its
	// devices are alive for three scans from each message.
	var rate int64
	if !periodic {
		switch t.Kind {
		case sparkplug.NBirth:
			rate = info.ScanRate
		case sparkplug.DBirth, sparkplug.NData, sparkplug.DData:
			var ok bool
			if rate, ok = s.nodeRate(node); !ok {
				return // stopping: left unacked
			}
		}
	}
	// A redelivery brings no lost device back (see onMessage).
	dup := m.Duplicate()
	signalOf := func(id string) signal {
		sig := s.pipe.signal(id, typ, node, hi, nil, nil)
		sig.lo = min(s.evidence.Load(), sig.at)
		if dup {
			sig.lo = 0
		}
		return sig
	}
	arm := func(id string) signal {
		sig := signalOf(id)
		switch {
		case periodic:
		case rate > 0:
			s.pipe.declare(&sig, Declared{Set: true, Next: sig.at + scansAlive*rate})
		default:
			s.pipe.declare(&sig, Declared{Set: true, TTD: -1})
		}
		return sig
	}
	var sigs []signal
	switch t.Kind {
	case sparkplug.NBirth, sparkplug.NDeath:
		op := "birth"
		if t.Kind == sparkplug.NDeath {
			op = "death"
		}
		counts, ok := s.nodeState(node, op, info.BdSeq, info.ScanRate)
		if !ok {
			return // stopping: left unacked
		}
		switch {
		case !counts:
			s.pipe.m.staleDeaths.Inc()
		case t.Kind == sparkplug.NBirth:
			sigs = append(sigs, arm(node))
		default:
			members, ok := s.nodeMembers(node)
			if !ok {
				return
			}
			// The node and all its devices, timed by this receipt.
			for _, d := range append(members, node) {
				sig := s.pipe.signal(d, "", node, hi, nil, nil)
				sig.lower, sig.own = shard.ReasonDeath, true
				sigs = append(sigs, sig)
			}
		}
	case sparkplug.DBirth:
		sigs = append(sigs, arm(id))
	case sparkplug.DDeath:
		at := hi
		if info.Timestamp > 0 {
			at = clampTo(time.UnixMilli(info.Timestamp), now.Add(-s.opts.MaxSkew), hi)
		}
		sig := s.pipe.signal(id, "", node, at, nil, nil)
		sig.lower, sig.own = shard.ReasonDeath, true
		sigs = append(sigs, sig)
	case sparkplug.NData, sparkplug.DData:
		if periodic || rate > 0 {
			sigs = append(sigs, arm(id))
		}
	}
	if len(sigs) == 0 {
		m.Ack()
		return
	}
	// The message is acked once every signal it gave is stored.
	acks := &sharedAck{Message: m}
	acks.left.Store(int32(len(sigs)))
	for _, sig := range sigs {
		sig.msg = acks
		s.answers.handOver()
		_ = s.pipe.enqueue(context.Background(), sig)
		s.answers.handedOver()
	}
}

// sharedAck acks its message once every signal holding it acked.
type sharedAck struct {
	mqtt.Message
	left atomic.Int32
}

func (a *sharedAck) Ack() {
	if a.left.Add(-1) == 0 {
		a.Message.Ack()
	}
}

// nodeState runs nodeStateScript for node, retrying until Redis answers;
// ok is false if ingest stopped first.
func (s *source) nodeState(node, op string, bdSeq, rate int64) (counts, ok bool) {
	err := s.retryStore("record a Sparkplug node's birth or death", func(ctx context.Context) error {
		n, err := s.pipe.store.Exec(ctx, nodeStateScript, []string{s.pipe.store.Keys().InPart(node, sparkplugLeaf)},
			[]string{node, op, strconv.FormatInt(bdSeq, 10), strconv.FormatInt(rate, 10)}).AsInt64()
		counts = n == 1
		return err
	})
	if err == nil && counts && op == "birth" {
		s.rates.Store(node, nodeRate{ms: rate, until: time.Now().Add(rateCacheFor)})
	}
	return counts, err == nil
}

// scansAlive is how many of its scans a periodic node and its devices stay
// alive from each message.
const scansAlive = 3

// rateCacheFor is how long a node's scan rate is taken from the cache: a
// birth seen by another process reaches this one within it.
const rateCacheFor = 10 * time.Second

// nodeRate is a cached scan rate.
type nodeRate struct {
	ms    int64
	until time.Time
}

// nodeRate returns node's scan rate from its latest birth (0: it reports
// by exception), retrying until Redis answers; ok is false if ingest
// stopped first.
func (s *source) nodeRate(node string) (rate int64, ok bool) {
	if v, found := s.rates.Load(node); found && time.Now().Before(v.(nodeRate).until) {
		return v.(nodeRate).ms, true
	}
	err := s.retryStore("read a Sparkplug node's scan rate", func(ctx context.Context) error {
		reply := s.pipe.store.Do(ctx, "HGET", []string{s.pipe.store.Keys().InPart(node, sparkplugLeaf)}, node+"#rate")
		if reply.IsNil() {
			rate = 0
			return nil
		}
		r, err := reply.AsInt64()
		rate = r
		return err
	})
	if err != nil {
		return 0, false
	}
	s.rates.Store(node, nodeRate{ms: rate, until: time.Now().Add(rateCacheFor)})
	return rate, true
}

// nodeMembers reads the devices of node's group, retrying until Redis
// answers; ok is false if ingest stopped first.
func (s *source) nodeMembers(node string) (ids []string, ok bool) {
	err := s.retryStore("read a Sparkplug node's devices", func(ctx context.Context) (err error) {
		ids, err = s.pipe.store.GroupMembers(ctx, node)
		return err
	})
	return slices.DeleteFunc(ids, func(id string) bool { return id == node }), err == nil
}

// retryStore calls f with storeTimeout until it succeeds, or until ingest
// stops (then it returns ErrStopped).
func (s *source) retryStore(what string, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.pipe.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	for attempt := 0; ; attempt++ {
		actx, acancel := context.WithTimeout(ctx, storeTimeout)
		err := f(actx)
		acancel()
		if err == nil {
			return nil
		}
		if !s.pipe.retry(ctx, attempt, what, err) {
			return ErrStopped
		}
	}
}

// onHostState answers another copy of this host's STATE saying offline
// (the will of a replica that stopped, with others still up): while this
// process is connected, the host is online.
func (s *source) onHostState(host string, m mqtt.Message) {
	m.Ack()
	if host != s.opts.Sparkplug.HostID {
		return
	}
	if online, _, err := sparkplug.DecodeState(m.Payload()); err == nil && !online {
		s.publishState()
	}
}

// stateBorn is the timestamp of this process's STATE birth and will: the
// two must match (Sparkplug 3.0).
var stateBorn = time.Now().UnixMilli()

// publishState publishes this host online, retained, on the signals'
// connection, whose will says offline.
func (s *source) publishState() {
	c := s.client.Load()
	if c == nil || s.opts.Sparkplug.HostID == "" {
		return
	}
	(*c).Publish(sparkplugStateTopic(s.opts.Sparkplug.HostID), 1, true, sparkplug.StatePayload(true, stateBorn))
}

// withState sets the STATE will on o, when Sparkplug has a host id.
func (s *source) withState(o *mqtt.ClientOptions) *mqtt.ClientOptions {
	if !s.opts.Sparkplug.Enabled || s.opts.Sparkplug.HostID == "" {
		return o
	}
	return o.SetBinaryWill(sparkplugStateTopic(s.opts.Sparkplug.HostID), sparkplug.StatePayload(false, stateBorn), 1, true)
}
