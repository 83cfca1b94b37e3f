package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sigwatch/sigwatch/internal/backoff"
	"golang.org/x/sync/errgroup"
)

// The device registry is the fleet's durable memory outside Redis
// (invariant 10): the known devices with their type, threshold override and
// lost state, and the installation record. It lives in a JetStream KV
// bucket beside the event stream, so it shares that stream's storage and
// replication. It is written on first sight and on changes, never per
// signal.
//
// KV keys are subjects, and a device id never enters a subject: a device's
// key is "d." and the hex of the first 16 bytes of the SHA-256 of its id,
// and the id is kept in the value.

// DeviceRecord is what the durable registry keeps per device.
type DeviceRecord struct {
	ID           string `json:"id"`
	Type         string `json:"t,omitempty"`
	Threshold    int64  `json:"thr,omitempty"` // per-device override, ms; 0 = none
	LostDeadline int64  `json:"ld,omitempty"`  // deadline it was declared lost at; 0 = not lost
	LostAt       int64  `json:"la,omitempty"`
	Alarm        string `json:"a,omitempty"` // the alarm role's raw state value (JSON text), "" = none
	Group        string `json:"g,omitempty"` // the device's group, "" = none
}

// RegistryMeta is the installation record: it exists from the first start of an installation on,
// so an empty Redis with a meta record is a loss, not a new installation.
type RegistryMeta struct {
	Installed   int64  `json:"installed"`            // unix ms
	Generation  string `json:"generation,omitempty"` // the Redis generation in force
	Shards      int    `json:"shards"`               // deadline topology high-water mark
	Prev        int    `json:"prev"`
	Epoch       int64  `json:"epoch"`
	AlarmShards int    `json:"alarm_shards,omitempty"` // the alarm repeat queue's topology
	AlarmPrev   int    `json:"alarm_prev,omitempty"`
	AlarmEpoch  int64  `json:"alarm_epoch,omitempty"`
}

// Registry is the durable device registry of an installation. It is safe for
// concurrent use.
type Registry struct {
	js     jetstream.JetStream
	room   *inflight // the publisher's: registry writes share its client
	kv     jetstream.KeyValue
	bucket string
	stream string        // the bucket's stream, KV_<bucket>
	idle   time.Duration // how long Each waits for a record it knows is pending
	later  chan later    // changes Later queued for Run
	log    *slog.Logger
}

const (
	registryMetaKey = "meta"
	// registryAttempts bounds the read-modify-write attempts of one record
	// that conflicting writers can force.
	registryAttempts = 32
	// registryInFlight bounds the records one Update works on at once.
	registryInFlight = 64
	// registryPull is how many records Each asks the server for at once: a
	// larger pull gained nothing on 100,000 records, a smaller one was slower.
	registryPull = 4096
)

// registryConflictWait spaces the attempts of writers that keep colliding.
var registryConflictWait = backoff.Policy{Base: time.Millisecond, Max: 64 * time.Millisecond}

// registryKey is the key of device id.
func registryKey(id string) string {
	sum := sha256.Sum256([]byte(id))
	return "d." + hex.EncodeToString(sum[:16])
}

// OpenRegistry opens (creating if absent) the bucket of the publisher's installation. Bucket name:
// p.opts.Stream + "_DEVICES" (e.g. SIGWATCH_DEVICES); storage and replicas follow nats.storage and
// nats.replicas (replicas are reconciled on an existing bucket like the stream is); history 1.
// Fails in core mode.
func (p *Bus) OpenRegistry(ctx context.Context) (*Registry, error) {
	if p.js == nil {
		return nil, fmt.Errorf("dispatch: the device registry needs JetStream, but nats.mode is %s: set nats.mode to jetstream", p.opts.Mode)
	}
	bucket := p.opts.Stream + "_DEVICES"
	storage, err := p.storage("registry")
	if err != nil {
		return nil, err
	}
	kv, err := p.js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = p.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: bucket, Description: "sigwatch device registry", History: 1, Storage: storage, Replicas: p.opts.Replicas,
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			// Created meanwhile by another process, maybe with other replicas.
			kv, err = p.js.KeyValue(ctx, bucket)
		}
	}
	if errors.Is(err, jetstream.ErrInvalidBucketName) {
		return nil, fmt.Errorf("dispatch: registry bucket %q: %w: nats.stream may hold only letters, digits, - and _", bucket, err)
	}
	if err != nil {
		return nil, fmt.Errorf("dispatch: registry bucket %s: %w", bucket, err)
	}
	r := &Registry{js: p.js, room: p.room, kv: kv, bucket: bucket, stream: "KV_" + bucket, idle: p.opts.AckWait,
		later: make(chan later, laterQueue), log: p.opts.Log}

	s, err := p.js.Stream(ctx, r.stream)
	if err != nil {
		return nil, fmt.Errorf("dispatch: registry bucket %s: %w", bucket, err)
	}
	cfg := s.CachedInfo().Config
	if cfg.Storage != storage {
		return nil, fmt.Errorf("dispatch: registry bucket %s has %s storage but nats.storage is %s: a bucket's storage cannot change; set nats.storage to match, or move the installation to a new nats.stream",
			bucket, cfg.Storage, storage)
	}
	if cfg.Replicas != p.opts.Replicas {
		next := cfg
		next.Replicas = p.opts.Replicas
		if _, err := p.js.UpdateStream(ctx, next); err != nil {
			return nil, fmt.Errorf("dispatch: registry bucket %s: apply replicas %d (it has %d): %w", bucket, p.opts.Replicas, cfg.Replicas, err)
		}
		if p.opts.Log != nil {
			p.opts.Log.Info("device registry updated to the configuration", "bucket", bucket, "replicas", p.opts.Replicas)
		}
	}
	return r, nil
}

// Update applies fn to the record of each id and writes the result with compare-and-set on the
// entry's revision (Create when absent), retrying a conflict by re-reading (bounded). fn gets the
// current record (zero with ID set when absent) and exists; it returns keep=false to write
// nothing, del=true (with keep) to delete the entry. The ID fn leaves is ignored: a record keeps
// the id it is stored under.
//
// Ids are processed concurrently, up to 64 in flight, so a burst costs about one round trip per
// 64 ids: fn is called from several goroutines at once, and again for an id on each retry, so it
// must only change the record it is given. errs[i] is the outcome for ids[i].
func (r *Registry) Update(ctx context.Context, ids []string, fn func(rec *DeviceRecord, exists bool) (keep, del bool)) []error {
	errs := make([]error, len(ids))
	var g errgroup.Group
	g.SetLimit(registryInFlight)
	for i, id := range ids {
		g.Go(func() error {
			errs[i] = r.update(ctx, id, fn)
			return nil
		})
	}
	_ = g.Wait() // the outcomes are in errs
	return errs
}

// update is one device's read-modify-write.
func (r *Registry) update(ctx context.Context, id string, fn func(rec *DeviceRecord, exists bool) (keep, del bool)) error {
	if !utf8.ValidString(id) {
		// JSON would store another id than the one the key is made of.
		return fmt.Errorf("dispatch: registry write of device %q: the id is not valid UTF-8", id)
	}
	key := registryKey(id)
	wait := backoff.Backoff{Policy: registryConflictWait}
	for range registryAttempts {
		rec, rev, err := r.device(ctx, key, id)
		if err != nil {
			return err
		}
		exists := rev != 0
		keep, del := fn(&rec, exists)
		if !keep || (del && !exists) {
			return nil
		}
		rec.ID = id
		if del {
			err = r.kv.Delete(ctx, key, jetstream.LastRevision(rev))
		} else {
			err = r.put(ctx, key, rev, rec)
		}
		if err == nil {
			return nil
		}
		if !isConflict(err) {
			return fmt.Errorf("dispatch: registry write of device %q: %w", id, err)
		}
		if !wait.Wait(ctx) {
			return fmt.Errorf("dispatch: registry write of device %q: %w", id, ctx.Err())
		}
	}
	return fmt.Errorf("dispatch: registry write of device %q: %d attempts in a row lost to other writers", id, registryAttempts)
}

// Get returns the record of device id; ok is false when there is none.
func (r *Registry) Get(ctx context.Context, id string) (rec DeviceRecord, ok bool, err error) {
	rec, rev, err := r.device(ctx, registryKey(id), id)
	return rec, rev != 0, err
}

// device reads the record of id under key and its revision; revision 0 is
// no record (the zero record with the id).
func (r *Registry) device(ctx context.Context, key, id string) (DeviceRecord, uint64, error) {
	rec := DeviceRecord{ID: id}
	rev, err := r.get(ctx, key, &rec)
	if err != nil {
		return DeviceRecord{ID: id}, 0, fmt.Errorf("dispatch: registry read of device %q: %w", id, err)
	}
	if rev != 0 && rec.ID != id {
		// 128 bits make this a corrupt record rather than a collision.
		return DeviceRecord{ID: id}, 0, fmt.Errorf("dispatch: registry read of device %q: key %s holds device %q", id, key, rec.ID)
	}
	return rec, rev, nil
}

// get decodes the value under key into v and returns its revision, 0 when
// the key is absent or deleted.
func (r *Registry) get(ctx context.Context, key string, v any) (uint64, error) {
	e, err := r.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if err := json.Unmarshal(e.Value(), v); err != nil {
		return 0, fmt.Errorf("key %s: %w", key, err)
	}
	return e.Revision(), nil
}

// put writes v under key if its revision is still rev (0: if it is absent).
func (r *Registry) put(ctx context.Context, key string, rev uint64, v any) error {
	value, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if rev == 0 {
		_, err = r.kv.Create(ctx, key, value)
	} else {
		_, err = r.kv.Update(ctx, key, value, rev)
	}
	return err
}

// isConflict reports whether err is a compare-and-set that lost to another
// writer: the key was created, changed or deleted since it was read.
func isConflict(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// Each calls fn for every device record (not the meta record), in no particular order, and stops
// at the first error fn returns. It reads the bucket with one ordered consumer that delivers the
// last message of each device key, so it costs a round trip per few thousand records rather than
// one per record. A device written during the walk may be seen with either value, or not at all if
// it is new.
func (r *Registry) Each(ctx context.Context, fn func(DeviceRecord) error) error {
	// Setting up a last-per-subject consumer over a large bucket takes the
	// server seconds (about five at 10M records): longer than a JetStream
	// request's default timeout, and than the wait for a next record.
	setup, cancel := context.WithTimeout(ctx, walkSetup)
	defer cancel()
	s, err := r.js.Stream(setup, r.stream)
	if err != nil {
		return fmt.Errorf("dispatch: registry walk: %w", err)
	}
	cons, err := s.OrderedConsumer(setup, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"$KV." + r.bucket + ".d.>"},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return fmt.Errorf("dispatch: registry walk: %w", err)
	}
	// The first record may come only once the setup is done.
	return drain(ctx, cons, "registry walk", r.idle, walkSetup, func(m jetstream.Msg) error {
		// A deleted device's key keeps a marker (an operation header and no
		// value) until the marker is purged.
		if h := m.Headers(); h.Get("KV-Operation") != "" || h.Get(jetstream.MarkerReasonHeader) != "" {
			return nil
		}
		var rec DeviceRecord
		if err := json.Unmarshal(m.Data(), &rec); err != nil {
			return fmt.Errorf("dispatch: registry walk: %s: %w", m.Subject(), err)
		}
		return fn(rec)
	})
}

// drain hands every message cons has pending now to fn, a server that
// stops delivering for idle (for first, before the first message) failing
// the walk instead of hanging it. what names the walk in its errors.
func drain(ctx context.Context, cons jetstream.Consumer, what string, idle, first time.Duration, fn func(jetstream.Msg) error) error {
	info, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("dispatch: %s: %w", what, err)
	}
	if info.NumPending == 0 {
		return nil
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(registryPull))
	if err != nil {
		return fmt.Errorf("dispatch: %s: %w", what, err)
	}
	defer it.Stop()
	for wait := max(idle, first); ; wait = idle {
		next, cancel := context.WithTimeout(ctx, wait)
		m, err := it.Next(jetstream.NextContext(next))
		cancel()
		if err != nil {
			return fmt.Errorf("dispatch: %s: %w", what, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("dispatch: %s: %w", what, err)
		}
		if err := fn(m); err != nil {
			return err
		}
		if md.NumPending == 0 {
			return nil
		}
	}
}

// walkSetup bounds the setting up of a registry walk.
const walkSetup = 2 * time.Minute

// Meta reads the installation record (ok=false when none).
func (r *Registry) Meta(ctx context.Context) (m RegistryMeta, ok bool, err error) {
	rev, err := r.get(ctx, registryMetaKey, &m)
	if err != nil {
		return RegistryMeta{}, false, fmt.Errorf("dispatch: registry meta: %w", err)
	}
	return m, rev != 0, nil
}

// UpdateMeta applies fn to the installation record (the zero record when there is none) and
// writes it with compare-and-set like Update, creating it when absent, and returns the record
// written. When fn returns false nothing is written and it returns the stored record (zero when
// none). fn is called again on each retry.
func (r *Registry) UpdateMeta(ctx context.Context, fn func(m *RegistryMeta) (keep bool)) (RegistryMeta, error) {
	wait := backoff.Backoff{Policy: registryConflictWait}
	for range registryAttempts {
		var stored RegistryMeta
		rev, err := r.get(ctx, registryMetaKey, &stored)
		if err != nil {
			return RegistryMeta{}, fmt.Errorf("dispatch: registry meta: %w", err)
		}
		m := stored
		if !fn(&m) {
			return stored, nil
		}
		err = r.put(ctx, registryMetaKey, rev, m)
		if err == nil {
			return m, nil
		}
		if !isConflict(err) {
			return RegistryMeta{}, fmt.Errorf("dispatch: registry meta write: %w", err)
		}
		if !wait.Wait(ctx) {
			return RegistryMeta{}, fmt.Errorf("dispatch: registry meta write: %w", ctx.Err())
		}
	}
	return RegistryMeta{}, fmt.Errorf("dispatch: registry meta write: %d attempts in a row lost to other writers", registryAttempts)
}

// Size returns the bucket's bytes and record count from its stream. The
// count includes the installation record and the markers deleted devices
// leave.
func (r *Registry) Size(ctx context.Context) (bytes uint64, records uint64, err error) {
	s, err := r.js.Stream(ctx, r.stream)
	if err != nil {
		return 0, 0, fmt.Errorf("dispatch: registry size: %w", err)
	}
	st := s.CachedInfo().State
	return st.Bytes, st.Msgs, nil
}
