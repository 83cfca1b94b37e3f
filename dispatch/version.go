package dispatch

import (
	"fmt"

	"github.com/sigwatch/sigwatch/internal/minversion"
)

// MinServerVersion is the oldest nats-server sigwatch's JetStream mode works
// with: its consumers filter on several subjects, new in 2.10. The atomic
// and fast batches of newer servers (2.12, 2.14) are used when there and
// replaced by single publishes when not.
const MinServerVersion = "2.10"

// checkServerVersion says what to do when the server at url runs version,
// older than MinServerVersion.
func checkServerVersion(url, version string) error {
	newer, ok := minversion.AtLeast(version, MinServerVersion)
	if ok && newer {
		return nil
	}
	if version == "" {
		version = "(version unknown)"
	}
	return fmt.Errorf("nats-server %s at %s: sigwatch needs %s or newer with JetStream "+
		"(go install github.com/nats-io/nats-server/v2@latest, or the release binaries; or set nats.mode core)",
		version, url, MinServerVersion)
}
