package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestHandlerOneLinePerMessagePerPeriod(t *testing.T) {
	now := time.Unix(0, 0)
	var buf bytes.Buffer
	down := ""
	log := slog.New(NewHandler(slog.NewTextHandler(&buf, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}), 10*time.Second, func() time.Time { return now }, func() string { return down }))
	ingest := log.With("role", "ingest")
	for range 5 {
		ingest.Warn("report failed", "err", "x")
		log.Info("info goes through")
	}
	ingest.Warn("report failed", "suppressed", 3) // a caller's own count
	ingest.Error("restore failed")
	now = now.Add(10 * time.Second)
	ingest.Warn("report failed", "err", "y")
	down = "redis"
	now = now.Add(10 * time.Second)
	ingest.Warn("report failed", "err", "z")
	ingest.Warn("lease lost")
	log.Warn("heartbeat failed")
	now = now.Add(10 * time.Second)
	log.Warn("heartbeat failed", "suppressed", 2)
	want := []string{
		`level=WARN msg="report failed" role=ingest err=x`,
		`level=INFO msg="info goes through"`,
		`level=INFO msg="info goes through"`,
		`level=INFO msg="info goes through"`,
		`level=INFO msg="info goes through"`,
		`level=INFO msg="info goes through"`,
		`level=ERROR msg="restore failed" role=ingest`,
		`level=WARN msg="report failed" role=ingest err=y suppressed=8`,
		`level=WARN msg="report failed" role=ingest err=z during="redis unavailable"`,
		`level=WARN msg="heartbeat failed" during="redis unavailable" suppressed=4`,
	}
	got := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got lines\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
