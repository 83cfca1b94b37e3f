package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sigwatch/sigwatch/internal/backoff"
)

// StormRecord is what the durable registry keeps per storm scope (a group
// or the fleet): the storm's state and its scope alarm's state, so that a
// storm outlives Redis losing data. Its key is "s." and the hex of the
// first 16 bytes of the SHA-256 of the scope: a group name never enters a
// subject either.
type StormRecord struct {
	Scope string `json:"scope"`
	State string `json:"s,omitempty"` // the storm's raw state value (JSON text)
	Alarm string `json:"a,omitempty"` // the scope alarm's raw state value
}

func stormKey(scope string) string {
	sum := sha256.Sum256([]byte(scope))
	return "s." + hex.EncodeToString(sum[:16])
}

// UpdateStorm applies fn to the record of scope (the zero record with the
// scope when there is none) and writes it, waiting for JetStream's ack,
// with compare-and-set on its revision like Update. fn returns false to
// write nothing; it is called again on each retry.
func (r *Registry) UpdateStorm(ctx context.Context, scope string, fn func(rec *StormRecord) (keep bool)) error {
	key := stormKey(scope)
	wait := backoff.Backoff{Policy: registryConflictWait}
	for range registryAttempts {
		rec := StormRecord{Scope: scope}
		rev, err := r.get(ctx, key, &rec)
		if err != nil {
			return fmt.Errorf("dispatch: registry read of storm %q: %w", scope, err)
		}
		if !fn(&rec) {
			return nil
		}
		rec.Scope = scope
		err = r.put(ctx, key, rev, rec)
		if err == nil {
			return nil
		}
		if !isConflict(err) {
			return fmt.Errorf("dispatch: registry write of storm %q: %w", scope, err)
		}
		if !wait.Wait(ctx) {
			return fmt.Errorf("dispatch: registry write of storm %q: %w", scope, ctx.Err())
		}
	}
	return fmt.Errorf("dispatch: registry write of storm %q: %d attempts in a row lost to other writers", scope, registryAttempts)
}

// Storms returns every storm record. There is one per scope that ever had
// a storm: few, read one by one.
func (r *Registry) Storms(ctx context.Context) ([]StormRecord, error) {
	return listRecords[StormRecord](ctx, r, "s.>", "storms")
}

// listRecords reads every record under the keys of filter, one by one: for
// the kinds of record there are few of. what names them in errors.
func listRecords[T any](ctx context.Context, r *Registry, filter, what string) ([]T, error) {
	l, err := r.kv.ListKeysFiltered(ctx, filter)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("dispatch: registry %s: %w", what, err)
	}
	defer func() { _ = l.Stop() }()
	var out []T
	for key := range l.Keys() {
		var rec T
		rev, err := r.get(ctx, key, &rec)
		if err != nil {
			return nil, fmt.Errorf("dispatch: registry %s: %w", what, err)
		}
		if rev != 0 {
			out = append(out, rec)
		}
	}
	return out, nil
}
