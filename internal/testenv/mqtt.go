package testenv

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
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

// MQTT5 connects an MQTT 5 client as clientID to the broker at url
// ("tcp://host:port"), fails the test if it is not connected within 10s,
// and disconnects it when the test ends.
func MQTT5(t testing.TB, url, clientID string) *paho.Client {
	t.Helper()
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(url, "tcp://"), 10*time.Second)
	if err != nil {
		t.Fatalf("testenv: MQTT 5 dial %s: %v", url, err)
	}
	c := paho.NewClient(paho.ClientConfig{ClientID: clientID, Conn: conn})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ca, err := c.Connect(ctx, &paho.Connect{ClientID: clientID, KeepAlive: 30, CleanStart: true})
	if err != nil || ca.ReasonCode != 0 {
		t.Fatalf("testenv: MQTT 5 connect to %s: %v (reason %v)", url, err, ca)
	}
	t.Cleanup(func() { _ = c.Disconnect(&paho.Disconnect{}) })
	return c
}

// Publish5 publishes payload on topic at QoS 1 with the user properties
// props (key, value, key, value…), waiting for the broker's PUBACK.
func Publish5(t testing.TB, c *paho.Client, topic string, payload []byte, props ...string) {
	t.Helper()
	p := &paho.Publish{Topic: topic, QoS: 1, Payload: payload, Properties: &paho.PublishProperties{}}
	for i := 0; i+1 < len(props); i += 2 {
		p.Properties.User = append(p.Properties.User, paho.UserProperty{Key: props[i], Value: props[i+1]})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Publish(ctx, p); err != nil {
		t.Fatalf("testenv: MQTT 5 publish %s: %v", topic, err)
	}
}
