package ingest

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// What the broker says of itself, in Mosquitto's $SYS topics: its version
// (whether it keeps one order per session, which the watermark may need),
// how many messages it dropped, and how long it has run (whether it
// restarted while the connection was down, see breaks).

// sysVersion is where Mosquitto publishes, retained, its name and
// version ("mosquitto version 2.0.11").
const sysVersion = "$SYS/broker/version"

// identifyWait bounds how long after subscribing to sysVersion the broker
// may take to identify itself.
const identifyWait = 3 * time.Second

// identify reports whether the broker on c identified itself as Mosquitto,
// which delivers all of a session's subscriptions in one order. If it did
// not, the error says why the broker is refused and what to change; with
// neither, the connection failed first and the next one tries again.
func (s *source) identify(c mqtt.Client) (bool, error) {
	version := make(chan string, 1)
	tok := c.Subscribe(sysVersion, 0, func(_ mqtt.Client, m mqtt.Message) {
		select {
		case version <- strings.TrimSpace(string(m.Payload())):
		default:
		}
	})
	if !tok.WaitTimeout(subscribeWait) || tok.Error() != nil {
		s.log.Warn("subscribing to the broker's version failed; trying again on the next connection", "err", tok.Error())
		return false, nil
	}
	defer c.Unsubscribe(sysVersion)
	if q := granted(tok)[sysVersion]; q == 0x80 {
		return false, s.unordered("refused a subscription to " + sysVersion)
	}
	select {
	case v := <-version:
		if strings.HasPrefix(strings.ToLower(v), "mosquitto") {
			s.log.Info("the MQTT broker keeps one order per session", "version", v)
			return true, nil
		}
		return false, s.unordered(fmt.Sprintf("identifies itself as %q, not Mosquitto", v))
	case <-time.After(identifyWait):
		if !c.IsConnectionOpen() {
			return false, nil
		}
		return false, s.unordered(fmt.Sprintf("did not identify itself within %v (no retained %s; Mosquitto publishes it unless sys_interval is 0)",
			identifyWait, sysVersion))
	}
}

// unordered is the refusal of a broker that is not known to keep one order
// per session, which the watermark needs with s.opts.ordered.
func (s *source) unordered(what string) error {
	return fmt.Errorf("ingest: the MQTT broker at %v %s. With %s, the watermark probes keep behind the signals "+
		"only on a broker that delivers all of a session's messages in one order, whatever subscription they match "+
		"(Mosquitto does; the NATS MQTT listener does not, and has no shared subscriptions). "+
		"Use one filter with a '+' at mqtt.id_level and no mqtt.shared_group, "+
		"or set mqtt.ordered_broker: true if this broker keeps one order per session",
		s.opts.Brokers, what, s.opts.ordered)
}

// sysDropped is where Mosquitto publishes how many messages it dropped.
const sysDropped = "$SYS/broker/publish/messages/dropped"

// sysUptime is where Mosquitto publishes, retained, how long it has run
// ("86400 seconds").
const sysUptime = "$SYS/broker/uptime"

func (s *source) onUptime(_ mqtt.Client, m mqtt.Message) {
	n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(string(m.Payload())), " seconds"), 10, 64)
	if err != nil || n < 0 {
		return
	}
	s.breaks.uptime(s.opts.Now().UnixMilli(), n)
}

func (s *source) onDropped(_ mqtt.Client, m mqtt.Message) {
	n, err := strconv.ParseInt(strings.TrimSpace(string(m.Payload())), 10, 64)
	if err != nil {
		return
	}
	s.brokerDropped.Store(n)
	// A lower count is a restarted broker: a new baseline, not a decrease.
	if old := s.dropBase.Swap(n); old >= 0 && n > old {
		s.droppedSeen.Add(n - old)
		s.log.Warn("the MQTT broker dropped messages: raise max_queued_messages (see deploy/local/mosquitto.conf)",
			"dropped_total", n, "new", n-old)
	}
}
