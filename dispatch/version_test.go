package dispatch

import (
	"strings"
	"testing"
)

// TestCheckServerVersion: a nats-server older than 2.10 is refused in one
// line naming the version found, where, the one needed and how to get it.
func TestCheckServerVersion(t *testing.T) {
	for _, v := range []string{"2.10.0", "2.10.22", "2.11.4", "2.15.2", "3.0.0"} {
		if err := checkServerVersion("nats://h:4222", v); err != nil {
			t.Errorf("nats-server %s refused: %v", v, err)
		}
	}
	for _, v := range []string{"2.9.10", "2.9.25", "2.2.0", ""} {
		err := checkServerVersion("nats://h:4222", v)
		if err == nil {
			t.Errorf("nats-server %q passed; sigwatch needs 2.10", v)
			continue
		}
		msg := err.Error()
		if strings.Contains(msg, "\n") || !strings.Contains(msg, "at nats://h:4222: sigwatch needs 2.10 or newer with JetStream") ||
			!strings.Contains(msg, "go install github.com/nats-io/nats-server/v2@latest") {
			t.Errorf("nats-server %q: %q, want one line naming the version, 2.10 and how to get it", v, msg)
		}
	}
	if err := checkServerVersion("u", "2.9.10"); !strings.HasPrefix(err.Error(), "nats-server 2.9.10 at u:") {
		t.Errorf("got %q, want it to start with the version found", err)
	}
}
