package sinks

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
)

// since is when the test alarms started: a minute ago, so that
// Alertmanager takes their startsAt.
var since = time.Now().Add(-time.Minute).UnixMilli()

// deviceNote is the notification of device dev-1's alarm in state.
func deviceNote(state, reason string, count int) Notification {
	a := &dispatch.Alarm{
		ID:     dispatch.LostID("dev-1", since) + "/" + state + "/" + strconv.Itoa(count),
		Device: "dev-1", Type: "meter", State: state, Reason: reason, Count: count,
		Since: since, At: since + int64(count)*1000, Group: "site-a", LastSeen: since - 30_000,
	}
	return Notification{ID: a.ID, Alarm: a}
}

// lifecycle is one device alarm's raise, repeat, ack and resolve.
func lifecycle() []Notification {
	return []Notification{
		deviceNote(stateRaised, "", 1),
		deviceNote(stateRepeat, "", 2),
		deviceNote(Acked, "", 2),
		deviceNote(stateResolved, "recovered", 2),
	}
}

// groupNote is the raised alarm of group gw-7 with lost devices, listing
// at most MaxDevices of them.
func groupNote(lost int) Notification {
	id := "$sigwatch-storm/group:gw-7"
	a := &dispatch.Alarm{
		ID: dispatch.LostID(id, since) + "/raised/1", Type: "sensor", State: stateRaised,
		Count: 1, Since: since, At: since, Group: "gw-7",
	}
	n := Notification{ID: a.ID, Alarm: a}
	for i := range min(lost, MaxDevices) {
		n.Devices = append(n.Devices, fmt.Sprintf("gw-7-dev-%04d", i))
	}
	n.More = lost - len(n.Devices)
	return n
}

// stormNote is a storm event.
func stormNote() Notification {
	s := &dispatch.Storm{ID: "storm/group:gw-7@1/started", Scope: "group", Group: "gw-7", State: "started", Devices: 1000, Watched: 1000, Since: since, At: since}
	return Notification{ID: s.ID, Storm: s}
}

// testClient is an HTTP client of its own, its connections closed when
// the test ends.
func testClient(t *testing.T, timeout time.Duration) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Timeout: timeout, Transport: tr}
}

// send delivers each notification the driver wants, failing the test on
// any error.
func send(t *testing.T, d driver, ns ...Notification) {
	t.Helper()
	for _, n := range ns {
		if !d.wants(n) {
			continue
		}
		if err := d.deliver(context.Background(), n); err != nil {
			t.Fatalf("deliver %s: %v", n.ID, err)
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
