package ingest

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// One MQTT client id, one live process: a broker closes the older of two
// connections with the same client id, so two processes that share one
// knock each other off every reconnect interval and both look to have
// outages. Each process claims its client id in Redis before it connects,
// renews the claim while it runs and releases it when it stops; a killed
// process's claim lapses after ClaimTTL.

// claimLeaf names the claims, one STRING per client id (value: the
// holder's process id), in {meta}.
const claimLeaf = "mqtt:"

// ClaimTTL is how long a claim outlives its holder's last renewal: a
// restart after a kill waits at most this long.
const ClaimTTL = 3 * time.Second

// claimRenew is how often the holder renews its claim.
const claimRenew = ClaimTTL / 3

// InUseError is the refusal of a client id another live process holds.
type InUseError struct{ ClientID, Holder string }

func (e *InUseError) Error() string {
	return fmt.Sprintf("mqtt.client_id %s is in use by process %s: set SIGWATCH_MQTT_CLIENT_ID (or mqtt.client_id) to an id of this process's own", e.ClientID, e.Holder)
}

// Claim is a process's hold on its MQTT client id.
type Claim struct {
	store    *shard.Store
	clientID string
	process  string
	log      *slog.Logger
	release  sync.Once
}

// claimScript takes or renews the claim of a client id.
//
// KEYS[1]: the claim STRING of the client id
// ARGV[1]: the claiming process's id; ARGV[2]: ttl, ms
// Returns: the holder's process id after the call (ARGV[1] when it is
// this process's now).
var claimScript = shard.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[1] then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]`)

func (c *Claim) key() string { return c.store.Keys().Meta(claimLeaf + c.clientID) }

func (c *Claim) try(ctx context.Context) (string, error) {
	holder, err := c.store.Exec(ctx, claimScript, []string{c.key()},
		[]string{c.process, strconv.FormatInt(ClaimTTL.Milliseconds(), 10)}).ToString()
	if err != nil {
		return "", fmt.Errorf("ingest: claim mqtt.client_id %s: %w", c.clientID, err)
	}
	return holder, nil
}

// ClaimClientID claims clientID for process before ingest connects. A
// claim another process holds is waited for up to ClaimTTL and a bit (a
// killed holder's claim lapses in that time); one still held then is
// refused with an *InUseError naming the holder.
func ClaimClientID(ctx context.Context, store *shard.Store, clientID, process string, log *slog.Logger) (*Claim, error) {
	c := &Claim{store: store, clientID: clientID, process: process, log: log}
	deadline := time.Now().Add(ClaimTTL + claimRenew)
	waited := false
	for {
		holder, err := c.try(ctx)
		if err != nil {
			return nil, err
		}
		if holder == process {
			return c, nil
		}
		if !time.Now().Before(deadline) {
			return nil, &InUseError{ClientID: clientID, Holder: holder}
		}
		if !waited {
			waited = true
			log.Info("mqtt.client_id is claimed by another process; waiting for its claim to lapse, as a stopped process's does",
				"client_id", clientID, "holder", holder, "wait", ClaimTTL.String())
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Run renews the claim until ctx is done, then releases it. A claim lost
// (Redis was unreachable for longer than ClaimTTL and another process took
// the id) is logged; this process keeps running, as it cannot tell which
// of the two should stop.
func (c *Claim) Run(ctx context.Context) error {
	tick := time.NewTicker(claimRenew)
	defer tick.Stop()
	defer c.Release()
	lost := ""
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		rctx, cancel := context.WithTimeout(ctx, claimRenew)
		holder, err := c.try(rctx)
		cancel()
		if err != nil || holder == c.process {
			lost = ""
			continue
		}
		if holder != lost {
			lost = holder
			c.log.Error("mqtt.client_id is now claimed by another process: the two knock each other off the broker; give each its own",
				"client_id", c.clientID, "holder", holder)
		}
	}
}

// releaseScript deletes the claim if this process holds it.
//
// KEYS[1]: the claim STRING; ARGV[1]: the process's id
// Returns: 1 if deleted, 0 otherwise.
var releaseScript = shard.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

// Release gives the client id up at once, for the next process; it is
// safe to call more than once.
func (c *Claim) Release() {
	c.release.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := c.store.Exec(ctx, releaseScript, []string{c.key()}, []string{c.process}).Error(); err != nil {
			c.log.Warn("releasing the mqtt.client_id claim failed; it lapses by itself", "client_id", c.clientID, "err", err)
		}
	})
}
