package fleet

import (
	"context"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestFleetPublishes checks that every live device signals once per interval,
// that silenced devices stop, and that Run leaves no goroutine behind.
func TestFleetPublishes(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true})
	sub := testenv.MQTT(t, mqtt.NewClientOptions().AddBroker(env.Mosquitto.URL).SetClientID("fleet-sub"))
	got := make(chan string, 10000)
	if tok := sub.Subscribe("devices/+/signal", 1, func(_ mqtt.Client, m mqtt.Message) { got <- m.Topic() }); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	before := testenv.IgnoreCurrent()
	f := New(Options{Broker: env.Mosquitto.URL, Devices: 50, Interval: 200 * time.Millisecond})
	f.Silence(0, time.Time{})
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	if err := f.Run(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.VerifyNone(t, before)
	if f.Failed() != 0 || f.Sent() < 49*2 {
		t.Fatalf("sent %d failed %d, want >= %d sent and none failed", f.Sent(), f.Failed(), 49*2)
	}
	testenv.WaitFor(t, 5*time.Second, "signals at the subscriber", func() bool { return len(got) >= int(f.Sent()) })
	for len(got) > 0 {
		if topic := <-got; topic == "devices/"+f.ID(0)+"/signal" {
			t.Fatalf("silenced device %s signalled", f.ID(0))
		}
	}
}

func TestFleetGroups(t *testing.T) {
	f := New(Options{Devices: 25, GroupSize: 10, Topic: "devices/{group}/{id}/signal"})
	if got := f.Topic(12); got != "devices/gw-1/dev-000012/signal" {
		t.Errorf("topic of device 12: %q", got)
	}
	now := time.Now()
	f.opts.SilenceFor = time.Minute
	f.darken(2, now)
	for i := range 25 {
		if want := i >= 20; f.Silent(i, now) != want {
			t.Errorf("device %d silent %v, want %v (group gw-2 is dark)", i, !want, want)
		}
	}
}
