package ingest

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sigwatch/sigwatch/shard"
)

// ConnectionsConfig is the mqtt.connections section: the broker's own
// reports of client connections, where it offers them — EMQX's
// $SYS/brokers/<node>/clients/<clientid>/connected|disconnected, AWS IoT's
// $aws/events/presence/connected|disconnected/<clientId> forwarded by a
// bridge, or the NATS MQTT listener's system advisories (fed through
// Ingest.Connection). A connect counts as a signal, a disconnect declares
// the device lost (after its type's confirm_after). They may come late,
// twice, out of order or not at all: each carries its connection's
// version (EMQX connected_at, AWS versionNumber, NATS the connection's
// start), and one older than the device's latest is ignored.
type ConnectionsConfig struct {
	Topics []string `yaml:"topics"` // MQTT filters of connection events; none: off
	// IDPattern maps a client id to a device id: a regular expression
	// whose first group is the id ("": the client id is the device id). A
	// client id it does not match is not a device, and is ignored.
	IDPattern string `yaml:"id_pattern"`
}

// Validate refuses connection settings that cannot work.
func (c ConnectionsConfig) Validate() error {
	if c.IDPattern == "" {
		return nil
	}
	re, err := regexp.Compile(c.IDPattern)
	if err != nil {
		return fmt.Errorf("mqtt.connections.id_pattern %q is not a regular expression: %v", c.IDPattern, err)
	}
	if re.NumSubexp() < 1 {
		return fmt.Errorf("mqtt.connections.id_pattern %q needs a group, e.g. ^dev-(.+)$, whose match is the device id", c.IDPattern)
	}
	return nil
}

// A ConnEvent is a broker's report that a client connected (Up) or
// disconnected. Version orders the reports of one client: a report with a
// lower version than the latest one seen is stale. 0 means unknown: the
// report is taken as it comes.
type ConnEvent struct {
	ClientID string
	Up       bool
	Version  int64
}

// ErrBadConnEvent refuses a connection event that cannot be read.
var ErrBadConnEvent = &InvalidError{Reason: "bad_connection_event", Msg: "connection event is not JSON with a client id and connected/disconnected"}

// ParseConnEvent reads an EMQX or AWS IoT connection event: the state is
// the payload's eventType or the topic level that says connected or
// disconnected; the client id is the payload's clientid/clientId; the
// version is AWS's versionNumber, else EMQX's connected_at.
func ParseConnEvent(topic string, payload []byte) (ConnEvent, error) {
	var v struct {
		ClientID    string `json:"clientid"`
		ClientID2   string `json:"clientId"`
		EventType   string `json:"eventType"`
		Version     *int64 `json:"versionNumber"`
		ConnectedAt int64  `json:"connected_at"`
	}
	if err := json.Unmarshal(payload, &v); err != nil {
		return ConnEvent{}, ErrBadConnEvent
	}
	ev := ConnEvent{ClientID: v.ClientID, Version: v.ConnectedAt}
	if ev.ClientID == "" {
		ev.ClientID = v.ClientID2
	}
	if v.Version != nil {
		ev.Version = *v.Version
	}
	state := v.EventType
	if state == "" {
		for _, l := range strings.Split(topic, "/") {
			if l == "connected" || l == "disconnected" {
				state = l
			}
		}
	}
	switch {
	case ev.ClientID == "" || ev.Version < 0:
		return ConnEvent{}, ErrBadConnEvent
	case state == "connected":
		ev.Up = true
	case state == "disconnected":
	default:
		return ConnEvent{}, ErrBadConnEvent
	}
	return ev, nil
}

// connStateScript keeps each device's latest connection report: a report
// older than it (a lower version), or a repeat of it, changes nothing.
//
// KEYS[1]: the HASH of the device's registry partition (leaf conn)
// ARGV[1]: device id; ARGV[2]: version; ARGV[3]: up or down
// Returns: 1 if the report counts, else 0.
var connStateScript = shard.NewScript(`
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local v = tonumber(ARGV[2])
if cur then
  local sep = string.find(cur, ':', 1, true)
  local cv, cs = tonumber(string.sub(cur, 1, sep - 1)), string.sub(cur, sep + 1)
  if v > 0 and (v < cv or (v == cv and cs == ARGV[3])) then return 0 end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. ARGV[3])
return 1`)

const connLeaf = "conn"

// deviceOf maps a client id to a device id by IDPattern. This process's
// own connections are never devices.
func (o *Options) deviceOf(clientID string) (string, bool) {
	if clientID == o.ClientID || clientID == o.ClientID+"-probe" {
		return "", false
	}
	if o.connPattern == nil {
		return clientID, clientID != ""
	}
	m := o.connPattern.FindStringSubmatch(clientID)
	if m == nil || m[1] == "" {
		return "", false
	}
	return m[1], true
}

// onConnEvent handles a connection event from MQTT, acked once stored.
func (s *source) onConnEvent(m mqtt.Message, now, hi time.Time) {
	ev, err := ParseConnEvent(m.Topic(), m.Payload())
	if err != nil {
		s.dead.refuse(err, m.Topic(), m, now)
		return
	}
	id, ok, err := s.connCounts(ev)
	switch {
	case err != nil:
		return // stopping: left unacked
	case !ok:
		m.Ack()
		return
	}
	sig := s.pipe.connSignal(id, ev, hi)
	sig.msg = m
	sig.lo = min(s.evidence.Load(), sig.at)
	if m.Duplicate() {
		sig.lo = 0
	}
	s.answers.handOver()
	_ = s.pipe.enqueue(context.Background(), sig)
	s.answers.handedOver()
}

// connCounts maps ev to its device and records it; ok is false for a
// client that is no device, or a stale report.
func (s *source) connCounts(ev ConnEvent) (id string, ok bool, err error) {
	id, ok = s.opts.deviceOf(ev.ClientID)
	if !ok || shard.CheckID(id, s.opts.MaxIDLen) != nil {
		return "", false, nil
	}
	state := "down"
	if ev.Up {
		state = "up"
	}
	var counts bool
	err = s.retryStore("record a connection event", func(ctx context.Context) error {
		n, err := s.pipe.store.Exec(ctx, connStateScript, []string{s.pipe.store.Keys().InPart(id, connLeaf)},
			[]string{id, strconv.FormatInt(ev.Version, 10), state}).AsInt64()
		counts = n == 1
		return err
	})
	if err == nil && !counts {
		s.pipe.m.staleConns.Inc()
	}
	return id, err == nil && counts, err
}

// connSignal is the signal (Up) or offline report of device id's ev at at.
func (p *pipeline) connSignal(id string, ev ConnEvent, at time.Time) signal {
	sig := p.signal(id, "", "", at, nil, nil)
	if !ev.Up {
		sig.lower = shard.ReasonDisconnect
	}
	return sig
}

// Connection takes a connection event from outside MQTT (the NATS MQTT
// listener's system advisories) and returns once it is stored. A client
// that is no device, or a stale report, is ignored. The event is stamped
// as it enters the pipeline, in order with the probe barriers (see
// enqueueStamped).
func (in *Ingest) Connection(ctx context.Context, ev ConnEvent) error {
	select {
	case <-in.started:
	case <-ctx.Done():
		return ctx.Err()
	}
	id, ok, err := in.src.connCounts(ev)
	if err != nil || !ok {
		return err
	}
	done := make(chan error, 1)
	err = in.pipe.hand(ctx, func() signal {
		sig := in.pipe.connSignal(id, ev, in.opts.Now())
		sig.done = done
		return sig
	}, true)
	if err != nil {
		return err
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
