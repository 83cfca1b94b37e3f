package testenv

import (
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// MQTT connects a client with o, fails the test if it is not connected within 10s, and
// disconnects it when the test ends.
func MQTT(t testing.TB, o *mqtt.ClientOptions) mqtt.Client {
	t.Helper()
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("testenv: MQTT connect to %v: %v", o.Servers, tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(100) })
	return c
}
