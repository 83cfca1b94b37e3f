package ingest

import (
	"fmt"
	"testing"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// twoFilters are two device filters with the id at level 1.
var twoFilters = []string{"devices/+/signal", "sensors/+/beat"}

// onTwoFilters spreads the signals over both of twoFilters.
func onTwoFilters(k int) string {
	if k%2 == 0 {
		return fmt.Sprintf("devices/o%d/signal", k)
	}
	return fmt.Sprintf("sensors/o%d/beat", k)
}

// Invariant 8 with several filters, on every broker: while Redis is frozen
// and thousands of signals wait on both filters' subscriptions, no
// watermark vouches for one that is not stored. Each filter's subscription
// carries a probe of its own, and the watermark is the earliest of them.
func TestWatermarkSeveralFilters(t *testing.T) {
	for _, broker := range brokers {
		t.Run(broker, func(t *testing.T) {
			r := newRig(t, testenv.Options{Mosquitto: broker == "mosquitto"})
			url := brokerURL(t, r, broker)
			r.start(t, Options{Brokers: []string{url}, ClientID: "ingest-filters", Topics: twoFilters})
			if n := unstoredUnderWatermarkOn(t, r, url, nil, onTwoFilters); n != 0 {
				t.Errorf("%d signals were under the watermark before their deadline was stored, want 0", n)
			}
		})
	}
}
