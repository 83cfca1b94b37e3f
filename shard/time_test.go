package shard_test

import (
	"context"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestTimeIsServerTime: Store.Time reads Redis server time, on a single
// Redis and on a cluster (where it reads the node that holds the
// watermark, so every process reads the same clock).
func TestTimeIsServerTime(t *testing.T) {
	for name, s := range testenv.SingleAndCluster(t, "sw") {
		t.Run(name, func(t *testing.T) {
			before := time.Now()
			got, err := s.Time(context.Background())
			after := time.Now()
			if err != nil {
				t.Fatal(err)
			}
			// The server runs on this host: its time lies between two local
			// readings (TIME has microsecond resolution).
			if got.Before(before.Add(-time.Microsecond)) || got.After(after.Add(time.Microsecond)) {
				t.Errorf("server time %v, want within [%v, %v]", got.Format(time.StampMicro),
					before.Format(time.StampMicro), after.Format(time.StampMicro))
			}
		})
	}
}
