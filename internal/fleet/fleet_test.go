package fleet

import (
	"context"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestFleetPublishes checks that every live device signals once per interval
// and that silenced devices stop.
func TestFleetPublishes(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true})
	sub := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(env.Mosquitto.URL).SetClientID("fleet-sub"))
	if tok := sub.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	defer sub.Disconnect(100)
	got := make(chan string, 10000)
	if tok := sub.Subscribe("devices/+/signal", 1, func(_ mqtt.Client, m mqtt.Message) { got <- m.Topic() }); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	f := New(Options{Broker: env.Mosquitto.URL, Devices: 50, Interval: 200 * time.Millisecond})
	f.Silence(0, time.Time{})
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	if err := f.Run(ctx); err != nil {
		t.Fatal(err)
	}
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
