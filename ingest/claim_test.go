package ingest

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestClaimClientID: a client id held by a live process is refused with
// the holder named; released, it is free at once; a holder that stops
// renewing (killed) loses it within ClaimTTL.
func TestClaimClientID(t *testing.T) {
	r := newRig(t, testenv.Options{})
	ctx := context.Background()
	log := testLog(t)
	a, err := ClaimClientID(ctx, r.store, "sw-x", "host-1-aa", log)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- a.Run(runCtx) }()

	_, err = ClaimClientID(ctx, r.store, "sw-x", "host-2-bb", log)
	var inUse *InUseError
	want := "mqtt.client_id sw-x is in use by process host-1-aa: set SIGWATCH_MQTT_CLIENT_ID"
	if !errors.As(err, &inUse) || inUse.Holder != "host-1-aa" || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("a second claim while the first is renewed: got %v, want %q", err, want)
	}
	// Another id is free.
	if _, err := ClaimClientID(ctx, r.store, "sw-y", "host-2-bb", log); err != nil {
		t.Errorf("another client id: %v", err)
	}

	stop()
	<-done // released on stop
	began := time.Now()
	b, err := ClaimClientID(ctx, r.store, "sw-x", "host-2-bb", log)
	if err != nil || time.Since(began) > time.Second {
		t.Fatalf("after the holder stopped: %v after %v, want the id at once", err, time.Since(began))
	}
	// b never renews, as if killed: its claim lapses.
	_ = b
	began = time.Now()
	if _, err := ClaimClientID(ctx, r.store, "sw-x", "host-3-cc", log); err != nil {
		t.Fatalf("after the holder was killed: %v after %v, want the id within %v", err, time.Since(began), ClaimTTL)
	}
}

// TestSameClientIDTwiceIsNamed: two clients with one client id knock each
// other off the broker; ingest says, once, that this is the likely cause.
func TestSameClientIDTwiceIsNamed(t *testing.T) {
	if os.Getenv(protocolEnv) == Protocol5 {
		// Two clients taking one id over from each other close each new
		// connection the moment it opens, where paho.golang v0.23.0's
		// autopaho races with itself (its Connect against the shutdown it
		// starts); the race detector stops the run.
		t.Skip("paho.golang races on a connection closed as it opens")
	}
	r := newRig(t, testenv.Options{Mosquitto: true})
	logs := &testenv.LogBuffer{}
	r.log = slog.New(slog.NewTextHandler(logs, nil))
	r.start(t, Options{ClientID: "sw-twice"})
	r.start(t, Options{ClientID: "sw-twice"})
	const said = "another client with the same mqtt.client_id may be connected"
	testenv.WaitFor(t, 20*time.Second, "the likely cause named", func() bool { return strings.Contains(logs.String(), said) })
	// Both ingests share the log: each says it once, however long they fight.
	testenv.Never(t, 3*time.Second, "the cause said more than once by each", func() bool { return strings.Count(logs.String(), said) > 2 })
}
