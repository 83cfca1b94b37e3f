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

// TypeRecord is what the durable registry keeps per device type with
// thresholds set at run time, so that they outlive Redis losing data. Its
// key is "t." and the hex of the first 16 bytes of the SHA-256 of the type:
// a type name never enters a subject either.
type TypeRecord struct {
	Type      string `json:"type"`
	Threshold int64  `json:"thr,omitempty"` // ms; 0 = the configuration's
	// Confirm is confirm_after in ms when ConfirmSet, else the
	// configuration's.
	Confirm    int64 `json:"ca,omitempty"`
	ConfirmSet bool  `json:"cas,omitempty"`
}

func typeKey(typ string) string {
	sum := sha256.Sum256([]byte(typ))
	return "t." + hex.EncodeToString(sum[:16])
}

// PutType writes rec as the record of its type, waiting for JetStream's
// ack; a record that sets nothing deletes it.
func (r *Registry) PutType(ctx context.Context, rec TypeRecord) error {
	key := typeKey(rec.Type)
	if rec.Threshold <= 0 && !rec.ConfirmSet {
		if err := r.kv.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("dispatch: registry delete of type %q: %w", rec.Type, err)
		}
		return nil
	}
	wait := backoff.Backoff{Policy: registryConflictWait}
	for range registryAttempts {
		var cur TypeRecord
		rev, err := r.get(ctx, key, &cur)
		if err != nil {
			return fmt.Errorf("dispatch: registry read of type %q: %w", rec.Type, err)
		}
		if rev != 0 && cur == rec {
			return nil
		}
		err = r.put(ctx, key, rev, rec)
		if err == nil {
			return nil
		}
		if !isConflict(err) {
			return fmt.Errorf("dispatch: registry write of type %q: %w", rec.Type, err)
		}
		if !wait.Wait(ctx) {
			return fmt.Errorf("dispatch: registry write of type %q: %w", rec.Type, ctx.Err())
		}
	}
	return fmt.Errorf("dispatch: registry write of type %q: %d attempts in a row lost to other writers", rec.Type, registryAttempts)
}

// Types returns every type record. There is one per type with a setting:
// few, read one by one.
func (r *Registry) Types(ctx context.Context) ([]TypeRecord, error) {
	return listRecords[TypeRecord](ctx, r, "t.>", "types")
}
