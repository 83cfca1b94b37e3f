package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// deviceGroup reads the group GET /v1/devices/{id} shows through the CLI.
func deviceGroup(t *testing.T, addr, id string) (string, error) {
	t.Helper()
	out, err := runCLI(t, addr, "device", "get", id, "--json")
	if err != nil {
		return "", fmt.Errorf("device get %s: %v\n%s", id, err, out)
	}
	var v struct {
		Group *string `json:"group"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		return "", fmt.Errorf("device get %s: %v\n%s", id, err, out)
	}
	if v.Group == nil {
		return "", nil
	}
	if *v.Group == "" {
		return "", fmt.Errorf("device get %s shows an empty group; want it left out", id)
	}
	return *v.Group, nil
}

// TestDeviceGroupsEndToEnd: devices get their group from an MQTT topic
// level, from the API (PUT /v1/devices/{id}/group, `sigwatch device group`)
// and from POST /v1/signals; `device get` and `device ls` show it; a lost
// event carries the group the device had, a recovered event the group of
// the signal that brought it back; a bad group is refused with a 400.
func TestDeviceGroupsEndToEnd(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	port, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	startProc(t, env, "sigwatch", "SIGWATCH_THRESHOLDS_DEFAULT=1s", "SIGWATCH_HTTP_ADDR="+addr,
		"SIGWATCH_MQTT_TOPICS=devices/+/+/signal", "SIGWATCH_MQTT_ID_LEVEL=2", "SIGWATCH_MQTT_GROUP_LEVEL=1")
	lost := watchLost(t, env)
	recovered := testenv.RecordStream[dispatch.Recovered](t, env.Conn(t), "SIGWATCH", "sigwatch.recovered.>")
	d := startDevices(t, env.Mosquitto.URL, 0, 200*time.Millisecond)
	d.mu.Lock()
	d.ids = append(d.ids, "gw-1/a1", "gw-1/a2", "gw-2/b1")
	d.mu.Unlock()

	testenv.WaitFor(t, 20*time.Second, "the devices' groups from the topic", func() bool {
		for id, want := range map[string]string{"a1": "gw-1", "a2": "gw-1", "b1": "gw-2"} {
			if g, err := deviceGroup(t, addr, id); err != nil || g != want {
				return false
			}
		}
		return true
	})

	out, err := runCLI(t, addr, "device", "group", "b1", "site-9", "--json")
	if err != nil || !strings.Contains(out, `"group": "site-9"`) || !strings.Contains(out, `"device": "b1"`) {
		t.Fatalf("device group b1 site-9: %v\n%s; want the device view with its new group", err, out)
	}
	if out, err := runCLI(t, addr, "device", "group", "a2", ""); err != nil {
		t.Fatalf("device group a2 \"\": %v\n%s", err, out)
	}
	for id, want := range map[string]string{"b1": "site-9", "a2": ""} {
		if g, err := deviceGroup(t, addr, id); err != nil || g != want {
			t.Errorf("group of %s = %q, %v; want %q", id, g, err, want)
		}
	}
	if out, err := runCLI(t, addr, "device", "ls"); err != nil || !strings.Contains(out, "GROUP") || !strings.Contains(out, "site-9") {
		t.Errorf("device ls: %v\n%s; want a group column with site-9", err, out)
	}

	// A bad group is refused; POST /v1/signals entries carry a group.
	put := func(id, body string) int {
		req, _ := http.NewRequest(http.MethodPut, "http://"+addr+"/v1/devices/"+id+"/group", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := put("b1", `{"group":"bad\u0001group"}`); code != http.StatusBadRequest {
		t.Errorf("PUT a group with a control character: %d, want 400", code)
	}
	if code := put("b1", `{}`); code != http.StatusBadRequest {
		t.Errorf("PUT without a group: %d, want 400", code)
	}
	resp, err := http.Post("http://"+addr+"/v1/signals", "application/json",
		bytes.NewReader([]byte(`[{"device":"p1","group":"gw-api"}]`)))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/signals with a group: %v %v", err, resp)
	}
	resp.Body.Close()
	// The alarm keys storms under ids starting with $sigwatch-: no device
	// may take one.
	resp, err = http.Post("http://"+addr+"/v1/signals", "application/json",
		bytes.NewReader([]byte(`[{"device":"$sigwatch-storm-gw-1"}]`)))
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Errorf("POST /v1/signals with a $sigwatch- id: %v %v, want 400", err, resp)
	} else {
		resp.Body.Close()
	}
	if code := put("$sigwatch-storm-gw-1", `{"group":"gw-1"}`); code != http.StatusBadRequest {
		t.Errorf("PUT the group of a $sigwatch- id: %d, want 400", code)
	}
	if g, err := deviceGroup(t, addr, "p1"); err != nil || g != "gw-api" {
		t.Errorf("group of p1 = %q, %v; want gw-api", g, err)
	}

	d.silence("gw-1/a1")
	d.silence("gw-2/b1")
	lost.WaitN(t, 15*time.Second, 3, "a1, b1 and p1 lost", func(l dispatch.Lost) bool { return l.Device != "a2" })
	for _, l := range lost.Bodies(nil) {
		want := map[string]string{"a1": "gw-1", "b1": "site-9", "p1": "gw-api"}[l.Device]
		if l.Device == "a2" || l.Group != want {
			t.Errorf("lost event %+v: want group %q (and a2 not lost)", l, want)
		}
	}

	d.revive("gw-1/a1")
	d.revive("gw-2/b1")
	recovered.WaitN(t, 15*time.Second, 2, "a1 and b1 recovered", nil)
	for _, r := range recovered.Bodies(nil) {
		if want := map[string]string{"a1": "gw-1", "b1": "gw-2"}[r.Device]; r.Group != want {
			t.Errorf("recovered event %+v: want group %q (the signal's)", r, want)
		}
	}
	if g, err := deviceGroup(t, addr, "b1"); err != nil || g != "gw-2" {
		t.Errorf("group of b1 back on its gateway = %q, %v; want gw-2", g, err)
	}
}
