package dispatch

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestParseClientAdvisory reads the server's advisories as it writes them
// and leaves out what is not an MQTT client with a client id.
func TestParseClientAdvisory(t *testing.T) {
	const conn = `{"type":"io.nats.server.advisory.v1.client_connect","server":{"name":"n1"},` +
		`"client":{"start":"2026-01-02T03:04:05.123456789Z","acc":"APP","client_type":"mqtt","client_id":"dev-1","kind":"Client"}}`
	a, ok, err := ParseClientAdvisory("$SYS.ACCOUNT.APP.CONNECT", []byte(conn))
	want := time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC)
	if err != nil || !ok || !a.Up || a.ClientID != "dev-1" || a.Account != "APP" || !a.Start.Equal(want) {
		t.Errorf("connect: %+v %v %v", a, ok, err)
	}
	const disc = `{"client":{"start":"2026-01-02T03:04:05.123456789Z","client_type":"mqtt","client_id":"dev-1"},"reason":"Client Closed"}`
	if a, ok, err := ParseClientAdvisory("$SYS.ACCOUNT.APP.DISCONNECT", []byte(disc)); err != nil || !ok || a.Up || a.Reason != "Client Closed" {
		t.Errorf("disconnect: %+v %v %v", a, ok, err)
	}
	for _, c := range []string{`{"client":{"client_type":"nats"}}`, `{"client":{"client_type":"mqtt"}}`} {
		if _, ok, err := ParseClientAdvisory("$SYS.ACCOUNT.APP.CONNECT", []byte(c)); ok || err != nil {
			t.Errorf("%s: taken (%v, %v)", c, ok, err)
		}
	}
	if _, _, err := ParseClientAdvisory("$SYS.ACCOUNT.APP.CONNECT", []byte("{")); err == nil {
		t.Error("broken JSON read")
	}
}

// TestAdvisoriesFollowMQTTClients: on a real server, the system user sees
// an MQTT client connect and disconnect, with one start; a plain NATS
// client is left out; a user outside the system account is refused.
func TestAdvisoriesFollowMQTTClients(t *testing.T) {
	env := testenv.New(t, testenv.Options{NATSMQTT: true, NATSSystem: true})
	c := DefaultConfig()
	c.URL = env.NATS.URL
	c.Advisories = AdvisoriesConfig{Enabled: true, User: "app", Password: "app"}
	if _, err := DialAdvisories(context.Background(), c, slog.Default()); err == nil || !strings.Contains(err.Error(), "system account") {
		t.Errorf("a user of the app account: %v, want refused", err)
	}
	c.Advisories.User, c.Advisories.Password = env.NATSSystem.User, env.NATSSystem.Password
	adv, err := DialAdvisories(context.Background(), c, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []ClientAdvisory
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- adv.Run(ctx, func(a ClientAdvisory) {
			mu.Lock()
			got = append(got, a)
			mu.Unlock()
		})
	}()

	env.Conn(t).Close()
	m := testenv.MQTT(t, mqtt.NewClientOptions().AddBroker(env.NATS.MQTTURL).SetClientID("dev-1"))
	m.Disconnect(0)
	testenv.WaitFor(t, 5*time.Second, "connect and disconnect advised", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= 2
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || !got[0].Up || got[1].Up || got[0].ClientID != "dev-1" || got[0].Start.IsZero() || !got[0].Start.Equal(got[1].Start) {
		t.Errorf("advisories %+v, want dev-1 up then down, with one start", got)
	}
}

// TestAdvisoriesNeedAUser: following the advisories without credentials of
// their own is refused, in one line that says what to set.
func TestAdvisoriesNeedAUser(t *testing.T) {
	c := DefaultConfig()
	c.Advisories.Enabled = true
	want := "nats.advisories.enabled needs nats.advisories.user or creds_file: only a system account user sees the advisories"
	if err := c.Validate(); err == nil || err.Error() != want {
		t.Errorf("Validate: %v, want %q", err, want)
	}
	c.Advisories.User = "sys"
	if err := c.Validate(); err != nil {
		t.Errorf("with a user: %v", err)
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("off by default: %v", err)
	}
}
