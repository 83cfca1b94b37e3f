package ingest

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// Options configure ingest. Zero values select the defaults given.
type Options struct {
	Brokers []string // e.g. tcp://127.0.0.1:1883, ssl://...; none: Run serves only Signal
	// ClientID is stable: it names the persistent session (CleanSession=false)
	// that keeps messages while ingest is away, and this member's watermark.
	// With a SharedGroup the session is clean instead: Mosquitto keeps
	// routing shared messages to a disconnected persistent member
	// (eclipse/mosquitto#1747), which would hide live devices' signals.
	ClientID string
	// Process names this process in the writer reports a doubling's drain
	// waits on and shows (default ClientID).
	Process string

	Username, Password string
	TLS                *tls.Config
	// Protocol is the MQTT version of the subscriber's connection:
	// Protocol311 (the default) or Protocol5, which also reads declared
	// deadlines from the messages' user properties.
	Protocol string

	Topics []string // MQTT filters, default ["devices/+/signal"]
	// Status are the status topics (mqtt.status): online and offline
	// reports of devices and their wills. No Topics: none.
	Status StatusConfig
	// Sparkplug is the Sparkplug B namespace (mqtt.sparkplug).
	Sparkplug SparkplugConfig
	// Connections are the broker's connection events (mqtt.connections).
	Connections ConnectionsConfig
	// IDLevel is the 0-based topic level carrying the device id, and
	// TypeLevel the level carrying the device type (-1: none). The zero
	// pair (both 0, which could never be valid) selects the defaults 1 and
	// -1.
	IDLevel   int
	TypeLevel int
	// GroupLevel is the level carrying the device's group; nil or negative:
	// none (a level of its own, since 0 is a level).
	GroupLevel  *int
	SharedGroup string // if set, subscribe "$share/<group>/<filter>"
	// QoS is the subscription's QoS: 0, 1 or 2; nil selects 1. At 1 and 2
	// a message is acked only once its deadline is stored, so the broker
	// delivers again what ingest did not store. At 0 the broker neither
	// waits for that nor delivers again: a signal in flight when ingest
	// stops, or lost on the way, is gone. It is a pointer because 0 is a
	// QoS, not "unset".
	QoS *byte

	Thresholds *shard.Thresholds // required
	// Registry is the durable device registry: devices first seen, and
	// devices back from being lost, are written to it before their signals
	// are acked (nil: none).
	Registry *dispatch.Registry

	TimestampMode string        // "receive" (default) or "payload": JSON field "ts", unix ms or RFC 3339
	MaxSkew       time.Duration // payload ts clamped into [now-MaxSkew, now]; default 1m

	// Config is the ingest section: the write path (Batch: flush once a
	// shard's batch holds this many signals; FlushInterval: or once the
	// oldest pending signal waited this long; MaxInFlight: signals received
	// but not yet stored and acked), MaxIDLen, and the watermark's
	// probes, outages and members. IdleProbeInterval is kept between
	// ProbeInterval and a quarter of OutageAfter. Zero fields select
	// DefaultConfig's.
	Config

	// ProbeTopic is where this member sends its watermark probes when they
	// cannot ride the signals' subscriptions (see Options.probes): with a
	// SharedGroup, a filter whose id level is not a '+', or filters that
	// overlap. Default "sigwatch/probe/<ClientID>".
	ProbeTopic string
	// OrderedBroker vouches that the broker delivers all of a session's
	// messages in one order, whatever subscription they match. The
	// watermark needs that unless there is one filter with a '+' at the id
	// level and no SharedGroup; without OrderedBroker, Run then checks that
	// the broker is Mosquitto (which does), and refuses it otherwise. The
	// NATS MQTT listener does not: once a session holds max_ack_pending
	// messages unacked, it skips a subscription's next messages (and
	// delivers them again only after ack_wait) while later ones pass.
	OrderedBroker bool

	Now func() time.Time // clock, default time.Now

	// Beat, when set, gives each flush loop a beat for the process's
	// liveness: New calls it once per loop, and the loop calls what it
	// returns at each batch, each store attempt and every second while it
	// waits for work. A loop wedged inside a flush stops beating.
	Beat func() func()

	// probes are the topics of the probes sent each interval, all with the
	// same time: one under each filter (ProbeTopicUnder) when they can ride
	// the signals' subscriptions (inband), else just ProbeTopic. ordered
	// says why the watermark needs a broker that keeps one order per
	// session, or is empty if it does not. Set by defaults.
	probes  []string
	inband  bool
	ordered string
	// connPattern is Connections.IDPattern compiled; nil: none.
	connPattern *regexp.Regexp
}

const (
	// TimestampReceive stamps a signal with the time ingest received it.
	TimestampReceive = "receive"
	// TimestampPayload takes the signal time from the payload's "ts".
	TimestampPayload = "payload"
)

// DefaultQoS is the subscription's QoS when Options.QoS is nil.
const DefaultQoS byte = 1

// DefaultProbeInterval is the default watermark probe period while a
// scanner has something due. A deadline fires only once the watermark has
// passed it, so the probe period is most of the scanner's fire lag; a probe
// costs one MQTT message and one Redis script per ingest member, however
// many devices and shards there are, and only while deadlines fall due.
const DefaultProbeInterval = 2 * time.Millisecond

// DefaultIdleProbeInterval is the default probe period while no scanner has
// anything due that waits for the watermark: a quiet installation then
// costs a few probes a second instead of a hundred. A scanner that starts
// waiting asks for the full rate (shard.Store.WantWatermark), which ingest
// keeps for fastHold after the last ask, so the first deadline after a quiet
// spell fires about one probe round trip later than the next ones.
const DefaultIdleProbeInterval = 250 * time.Millisecond

// fastHold is how long ingest probes at its full rate after a scanner
// asked for it (scanners ask every 100ms while they wait).
const fastHold = time.Second

const (
	// flushers bounds the flushes to Redis running at once.
	flushers = 4
	// idleBeat is how often a flush loop without work beats.
	idleBeat = time.Second
	// drainTimeout bounds how long Run, when stopping, waits for what is
	// in flight to be stored (and, in a shared group, for the hand-over
	// before that). What is not stored by then is not acked: a persistent
	// session keeps it for the next run, but the broker drops it with a
	// clean (shared) session, so such a member stays in its group's
	// watermark and the gap becomes an outage.
	drainTimeout = 5 * time.Second
	// invalidQueue bounds refusals waiting for the dead-letter publish
	// (copies: the messages are acked at once). When it is full the
	// oldest is dropped, so a flood of bad input or a NATS outage never
	// holds up good devices nor grows memory.
	invalidQueue = 1024
	// reconnectMax caps paho's reconnect back-off.
	reconnectMax = 2 * time.Second
	// storeTimeout bounds one attempt of a Redis call. Without a deadline
	// the client keeps retrying a dead connection inside the call, and
	// nothing would be counted or logged.
	storeTimeout = 3 * time.Second
)

// defaults fills in the zero values from the package's default config
// (the only copy of each default) and checks what is left by its rules. A
// negative number, like zero, selects the default: max(v, 0) makes it zero
// for cmp.Or.
func (o *Options) defaults() error {
	m, ts, c := DefaultMQTTConfig(), DefaultTimestampConfig(), DefaultConfig()
	if len(o.Topics) == 0 {
		o.Topics = m.Topics
	}
	if o.IDLevel == 0 && o.TypeLevel == 0 {
		o.IDLevel, o.TypeLevel = m.IDLevel, m.TypeLevel
	}
	if o.TypeLevel < 0 {
		o.TypeLevel = -1
	}
	g := -1
	if o.GroupLevel != nil && *o.GroupLevel >= 0 {
		g = *o.GroupLevel
	}
	o.GroupLevel = &g
	// A copy, so that the caller's byte is not shared with Run.
	q := DefaultQoS
	if o.QoS != nil {
		q = *o.QoS
	}
	o.QoS = &q
	o.Protocol = cmp.Or(o.Protocol, Protocol311)
	o.TimestampMode = cmp.Or(o.TimestampMode, ts.Mode)
	o.MaxSkew = cmp.Or(max(o.MaxSkew, 0), ts.MaxSkew)
	o.MaxIDLen = cmp.Or(max(o.MaxIDLen, 0), c.MaxIDLen)
	o.Batch = cmp.Or(max(o.Batch, 0), c.Batch)
	o.FlushInterval = cmp.Or(max(o.FlushInterval, 0), c.FlushInterval)
	o.MaxInFlight = cmp.Or(max(o.MaxInFlight, 0), c.MaxInFlight)
	o.ProbeInterval = cmp.Or(max(o.ProbeInterval, 0), c.ProbeInterval)
	o.OutageAfter = cmp.Or(max(o.OutageAfter, 0), c.OutageAfter)
	// An idle gap between two probes must stay far from an outage.
	o.IdleProbeInterval = max(min(cmp.Or(max(o.IdleProbeInterval, 0), c.IdleProbeInterval), o.OutageAfter/4), o.ProbeInterval)
	o.ReconnectGrace = cmp.Or(max(o.ReconnectGrace, 0), c.ReconnectGrace)
	o.MemberTimeout = cmp.Or(max(o.MemberTimeout, 0), c.MemberTimeout)
	o.ProbeTopic = cmp.Or(o.ProbeTopic, "sigwatch/probe/"+o.ClientID)
	o.probes, o.ordered = inbandProbes(o)
	o.inband = o.ordered == ""
	switch {
	case !o.inband:
		o.probes = []string{o.ProbeTopic}
	case len(o.probes) > 1:
		// Each probe is then in order with its own subscription only on a
		// broker that does not skip a subscription's messages for the
		// others' sake (see OrderedBroker).
		o.ordered = fmt.Sprintf("several filters (%q)", o.Topics)
	}
	if len(o.Status.Topics) > 0 && o.ordered == "" {
		// A probe on the signals' filters vouches for a status report only
		// on a broker that keeps one order per session.
		o.ordered = fmt.Sprintf("status topics (%q)", o.Status.Topics)
	}
	if len(o.Connections.Topics) > 0 && o.ordered == "" {
		o.ordered = fmt.Sprintf("connection event topics (%q)", o.Connections.Topics)
	}
	if o.Connections.IDPattern != "" {
		o.connPattern, _ = regexp.Compile(o.Connections.IDPattern) // checked below
	}
	if o.Sparkplug.Enabled && o.ordered == "" {
		o.ordered = "the Sparkplug namespace (mqtt.sparkplug)"
	}
	if o.Now == nil {
		o.Now = time.Now
	}

	switch {
	case o.Thresholds == nil:
		return errors.New("ingest: options: Thresholds is required")
	case len(o.Brokers) > 0 && o.ClientID == "":
		return errors.New("ingest: options: set a stable ClientID: it names the persistent session that keeps messages while ingest is away")
	case strings.ContainsAny(o.ProbeTopic, "+#"):
		return fmt.Errorf("ingest: options: probe topic %q must not contain wildcards", o.ProbeTopic)
	}
	mc := MQTTConfig{IDLevel: o.IDLevel, TypeLevel: o.TypeLevel, GroupLevel: *o.GroupLevel, QoS: int(*o.QoS), SharedGroup: o.SharedGroup, Protocol: o.Protocol}
	tc := TimestampConfig{Mode: o.TimestampMode, MaxSkew: o.MaxSkew}
	if err := errors.Join(mc.Validate(), tc.Validate(), o.Status.Validate(), o.Sparkplug.Validate(), o.Connections.Validate()); err != nil {
		return fmt.Errorf("ingest: options: %w", err)
	}
	return nil
}

// ProbeIDPrefix starts the device id of a probe that rides a signal
// subscription (ProbeTopicUnder). Such ids are never devices: a member
// ignores other members' probes.
const ProbeIDPrefix = shard.ReservedIDPrefix + "probe-"

// ProbeTopicUnder returns a probe topic that filter matches, with the id
// level (idLevel, a '+' in filter) holding ProbeIDPrefix+clientID. A probe
// on it travels on the signals' own subscription, so a broker that delivers
// each subscription on its own (the NATS MQTT listener: one JetStream
// consumer each, parking what does not fit a session's window) still
// cannot let it overtake a signal it had before.
func ProbeTopicUnder(filter string, idLevel int, clientID string) (string, error) {
	levels := strings.Split(filter, "/")
	if idLevel >= len(levels) || levels[idLevel] != "+" {
		return "", fmt.Errorf("ingest: probe topic under %q: the id level %d is not a '+'", filter, idLevel)
	}
	for j, l := range levels {
		switch {
		case j == idLevel:
			levels[j] = ProbeIDPrefix + clientID
		case l == "+" || l == "#":
			levels[j] = "probe"
		}
	}
	return strings.Join(levels, "/"), nil
}

// inbandProbes returns one probe topic under each distinct filter, which
// rides that filter's subscription: a session with one subscription gets
// it in order from any broker, and one with several from a broker that
// keeps one order per session (see OrderedBroker), so a probe that comes
// back vouches for every signal on that filter the broker had before it.
// If probes cannot ride the signals' subscriptions, it returns why
// instead.
func inbandProbes(o *Options) ([]string, string) {
	if o.SharedGroup != "" {
		return nil, fmt.Sprintf("a shared group (mqtt.shared_group %q)", o.SharedGroup)
	}
	if strings.ContainsAny(o.ClientID, "/+#") {
		return nil, fmt.Sprintf("a client id with '/', '+' or '#' (%q)", o.ClientID)
	}
	var filters, probes []string
	for _, f := range o.Topics {
		if slices.Contains(filters, f) {
			continue
		}
		t, err := ProbeTopicUnder(f, o.IDLevel, o.ClientID)
		if err != nil {
			return nil, fmt.Sprintf("filter %q, whose level %d (mqtt.id_level) is not a '+'", f, o.IDLevel)
		}
		filters, probes = append(filters, f), append(probes, t)
	}
	// A probe that another filter matches too may come back on that
	// filter's subscription first, which vouches for nothing on its own.
	for k, t := range probes {
		for j, f := range filters {
			if j != k && topicMatches(f, t) {
				return nil, fmt.Sprintf("overlapping filters (%q and %q)", filters[k], f)
			}
		}
	}
	return probes, ""
}

// probeIndex returns the index in probes of topic, or -1 if it is not one
// of this member's probe topics.
func (o *Options) probeIndex(topic string) int {
	return slices.Index(o.probes, topic)
}

// topicMatches reports whether the MQTT filter matches topic.
func topicMatches(filter, topic string) bool {
	fs, ts := strings.Split(filter, "/"), strings.Split(topic, "/")
	for j, f := range fs {
		if f == "#" {
			return true
		}
		if j >= len(ts) || (f != "+" && f != ts[j]) {
			return false
		}
	}
	return len(fs) == len(ts)
}
