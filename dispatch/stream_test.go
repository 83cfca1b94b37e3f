package dispatch

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

func streamConfig(t *testing.T, js jetstream.JetStream) jetstream.StreamConfig {
	t.Helper()
	s, err := js.Stream(context.Background(), "SIGWATCH")
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().Config
}

// TestStreamFollowsConfiguration proves that the stream's limits follow the
// configuration at every start, not only at creation: a changed max_age,
// max_bytes, max_msgs or duplicates window is applied to the existing
// stream, and a change the stream cannot take (its storage) is refused
// with what to do.
func TestStreamFollowsConfiguration(t *testing.T) {
	ctx := context.Background()
	nc, js := natsConn(t)

	newPublisher(t, nc, Options{MaxAge: time.Hour, Duplicates: time.Minute})
	if got := streamConfig(t, js); got.MaxAge != time.Hour || got.Duplicates != time.Minute {
		t.Fatalf("created with max_age %v, duplicates %v; want 1h, 1m", got.MaxAge, got.Duplicates)
	}

	want := Options{MaxAge: 48 * time.Hour, Duplicates: 5 * time.Second, MaxBytes: 1 << 30, MaxMsgs: 1_000_000}
	newPublisher(t, nc, want)
	got := streamConfig(t, js)
	t.Logf("after a restart with new settings: max_age %v, duplicates %v, max_bytes %d, max_msgs %d",
		got.MaxAge, got.Duplicates, got.MaxBytes, got.MaxMsgs)
	if got.MaxAge != want.MaxAge || got.Duplicates != want.Duplicates || got.MaxBytes != want.MaxBytes || got.MaxMsgs != want.MaxMsgs {
		t.Errorf("stream kept max_age %v, duplicates %v, max_bytes %d, max_msgs %d; want %v, %v, %d, %d",
			got.MaxAge, got.Duplicates, got.MaxBytes, got.MaxMsgs, want.MaxAge, want.Duplicates, want.MaxBytes, want.MaxMsgs)
	}

	_, err := New(ctx, nc, Options{Storage: "memory", MaxAge: 48 * time.Hour})
	if err == nil || !strings.Contains(err.Error(), "storage") {
		t.Errorf("a storage change: got %v, want a refusal that names the storage", err)
	}
}

// TestDefaultConfigLimitsTheStream shows that the stream sigwatch creates
// from its default configuration does not grow for ever.
func TestDefaultConfigLimitsTheStream(t *testing.T) {
	nc, js := natsConn(t)
	newPublisher(t, nc, DefaultConfig().Options)
	if got := streamConfig(t, js); got.MaxAge <= 0 || got.MaxAge > 30*24*time.Hour {
		t.Errorf("default stream max_age %v, want a limit of at most 30 days", got.MaxAge)
	}
}
