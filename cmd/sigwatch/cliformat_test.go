package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestEventLine: each kind of event reads as one line: the local time of
// the event, what happened, to whom, and the numbers that matter.
func TestEventLine(t *testing.T) {
	at := time.Date(2030, 1, 2, 15, 4, 5, 0, time.Local)
	ms := at.UnixMilli()
	for _, c := range []struct {
		name, body, want string
	}{
		{"lost", `{"device":"pump-1","type":"pump","last_seen":` + itoa(ms-31200) + `,"fired_at":` + itoa(ms) + `}`,
			"2030-01-02 15:04:05  lost            pump-1  type=pump  silent 31.2s"},
		{"recovered", `{"device":"pump-1","type":"pump","group":"gw-1","lost_at":` + itoa(ms-90000) + `,"recovered_at":` + itoa(ms) + `}`,
			"2030-01-02 15:04:05  recovered       pump-1  type=pump  group=gw-1  back after 1m30s lost"},
		{"alarm", `{"device":"pump-1","type":"pump","state":"repeat","count":3,"at":` + itoa(ms) + `}`,
			"2030-01-02 15:04:05  alarm repeat    pump-1  type=pump  count=3"},
		{"storm", `{"scope":"group","group":"gw-1","state":"started","devices":25,"watched":50,"at":` + itoa(ms) + `}`,
			"2030-01-02 15:04:05  storm started   group gw-1  25 of 50 lost"},
		{"storm", `{"scope":"group","group":"gw-1","state":"ended","devices":24,"watched":50,"at":` + itoa(ms) + `}`,
			"2030-01-02 15:04:05  storm ended     group gw-1  24 of 50 still lost"},
		{"system", `{"kind":"redis_restored","at":` + itoa(ms) + `,"details":{"missing":0}}`,
			"2030-01-02 15:04:05  system          redis_restored  missing=0"},
		{"timer", `{"queue":"orders","timer":"o-1","deadline":` + itoa(ms-12) + `,"fired_at":` + itoa(ms) + `,"payload":null}`,
			"2030-01-02 15:04:05  timer           orders/o-1  late 12ms"},
	} {
		if got := eventLine(c.name, []byte(c.body)); got != c.want {
			t.Errorf("%s %s:\ngot  %q\nwant %q", c.name, c.body, got, c.want)
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestAlarmListExplainsHeld: alarm ls says under its table what held
// means, when a held alarm is in it, and shows times as local clock times.
func TestAlarmListExplainsHeld(t *testing.T) {
	since := time.Now().Add(-time.Minute)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"alarms":[{"device":"pump-1","type":"pump","state":"held","since":` + itoa(since.UnixMilli()) + `}]}`))
	}))
	t.Cleanup(srv.Close)
	var out bytes.Buffer
	if err := cmdAlarm(t.Context(), []string{"ls", "--api", srv.URL}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"pump-1", since.Local().Format("15:04:05"), "held: the device is lost, but its alarm is not raised yet"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("alarm ls printed:\n%s\nwant %q in it", out.String(), want)
		}
	}
}
