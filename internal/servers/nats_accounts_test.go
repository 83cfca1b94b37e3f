package servers_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sigwatch/sigwatch/internal/servers"
)

// TestNATSSystemAccount: with a system user, clients without credentials
// still get JetStream and the MQTT listener, and the system user sees the
// MQTT clients' connect and disconnect advisories.
func TestNATSSystemAccount(t *testing.T) {
	n, err := servers.StartNATS(t.TempDir(), servers.NATSOptions{MQTT: true, SystemUser: "sys", SystemPassword: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Shutdown)

	sys, err := nats.Connect(n.URL, nats.UserInfo("sys", "pw"))
	if err != nil {
		t.Fatalf("system user: %v", err)
	}
	defer sys.Close()
	sub, err := sys.SubscribeSync("$SYS.ACCOUNT.*.*")
	if err != nil {
		t.Fatal(err)
	}
	if err := sys.Flush(); err != nil {
		t.Fatal(err)
	}

	nc, err := nats.Connect(n.URL)
	if err != nil {
		t.Fatalf("no credentials: %v", err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(ctx(t), jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatalf("JetStream without credentials: %v", err)
	}
	c, err := mqttConnect(t, n.MQTTURL, "dev-1", "", "")
	if err != nil {
		t.Fatalf("MQTT without credentials: %v", err)
	}
	c.Disconnect(0)

	var seen []string
	for len(seen) < 2 {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("advisories seen %v: %v", seen, err)
		}
		var ev struct {
			Client struct {
				Type string `json:"client_type"`
				ID   string `json:"client_id"`
				Acc  string `json:"acc"`
			} `json:"client"`
		}
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Client.Type == "mqtt" && ev.Client.ID == "dev-1" {
			seen = append(seen, m.Subject+" "+ev.Client.Acc)
		}
	}
	if seen[0] != "$SYS.ACCOUNT.APP.CONNECT APP" || seen[1] != "$SYS.ACCOUNT.APP.DISCONNECT APP" {
		t.Errorf("advisories %q, want APP's CONNECT then DISCONNECT", seen)
	}
}
