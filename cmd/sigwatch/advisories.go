package main

import (
	"context"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/ingest"
)

// advisoryTimeout bounds storing one advisory: one that takes longer is
// dropped, and the device's deadline stays the backstop.
const advisoryTimeout = 5 * time.Second

// newAdvisories connects the follower of the NATS MQTT listener's client
// advisories, with the ingest role and nats.advisories.enabled.
func (a *App) newAdvisories(ctx context.Context) error {
	if a.in == nil || !a.cfg.NATS.Advisories.Enabled {
		return nil
	}
	var err error
	a.advisories, err = dispatch.DialAdvisories(ctx, a.cfg.NATS, a.log.With("role", "ingest"))
	return err
}

// runAdvisories stores each advisory as ingest's connection event, ordered
// by its connection's start: a disconnect of a connection older than the
// client's latest is stale.
func (a *App) runAdvisories(ctx context.Context) error {
	return a.advisories.Run(ctx, func(adv dispatch.ClientAdvisory) {
		ev := ingest.ConnEvent{ClientID: adv.ClientID, Up: adv.Up}
		if !adv.Start.IsZero() {
			ev.Version = adv.Start.UnixNano()
		}
		cctx, cancel := context.WithTimeout(ctx, advisoryTimeout)
		defer cancel()
		if err := a.in.Connection(cctx, ev); err != nil && ctx.Err() == nil {
			a.log.Warn("NATS client advisory not stored", "client_id", adv.ClientID, "err", err)
		}
	})
}
