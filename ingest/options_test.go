package ingest

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// The QoS rule: nil means 1; 0, 1 and 2 are kept as given (0 is a QoS, not
// "unset"); anything above 2 is refused.
func TestQoSRule(t *testing.T) {
	thr := shard.NewThresholds(nil, time.Minute, nil)
	for _, tc := range []struct {
		qos     *byte
		want    byte
		refused bool
	}{
		{nil, 1, false},
		{new(byte(0)), 0, false},
		{new(byte(1)), 1, false},
		{new(byte(2)), 2, false},
		{new(byte(3)), 0, true},
	} {
		name := "nil"
		if tc.qos != nil {
			name = fmt.Sprint(*tc.qos)
		}
		o := Options{Thresholds: thr, QoS: tc.qos}
		err := o.defaults()
		switch {
		case tc.refused:
			if err == nil || !strings.Contains(err.Error(), "use 1 (the default) or 2") {
				t.Errorf("QoS %s: got error %v, want a refusal saying which to use", name, err)
			}
		case err != nil:
			t.Errorf("QoS %s: got error %v, want none", name, err)
		case *o.QoS != tc.want:
			t.Errorf("QoS %s: runs at %d, want %d", name, *o.QoS, tc.want)
		}
	}
}

// logRecorder keeps the records logged through it.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	return nil
}

// find returns the value of attr in the first record with message msg.
func (l *logRecorder) find(msg, attr string) (slog.Value, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.recs {
		if r.Message != msg {
			continue
		}
		var v slog.Value
		found := false
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == attr {
				v, found = a.Value, true
			}
			return !found
		})
		return v, found
	}
	return slog.Value{}, false
}

// Each QoS runs as configured: the broker grants the subscription the QoS
// asked for, and signals are stored.
func TestQoSRunsAsConfigured(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true})
	dev := device(t, r.env.Mosquitto.URL)
	for _, qos := range []byte{0, 1, 2} {
		t.Run(fmt.Sprint(qos), func(t *testing.T) {
			logs := &logRecorder{}
			r.log = slog.New(logs)
			defer func() { r.log = nil }()
			run := r.start(t, Options{ClientID: fmt.Sprintf("ingest-qos-%d", qos), QoS: &qos})
			// The line follows the subscription that start waits for.
			var v slog.Value
			testenv.WaitFor(t, 5*time.Second, "the connection to be logged", func() bool {
				var ok bool
				v, ok = logs.find("connected to MQTT broker", "qos")
				return ok
			})
			if v.Kind() != slog.KindUint64 || v.Uint64() != uint64(qos) {
				t.Errorf("subscribed with qos %v, want %d", v, qos)
			}
			if _, ok := logs.find("broker granted a lower QoS than asked for", "granted"); ok {
				t.Errorf("the broker granted less than QoS %d", qos)
			}
			id := fmt.Sprintf("qos%d", qos)
			if tok := dev.Publish("devices/"+id+"/signal", 2, false, ""); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
				t.Fatalf("publish: %v", tok.Error())
			}
			run.stored(t, 1)
			mustDeadline(t, r, id)
		})
	}
}
