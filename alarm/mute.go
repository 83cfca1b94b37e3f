package alarm

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
)

// Mute suppresses the notifications of one device, or of every device of
// one type, for a time window. The alarms underneath go on: their state
// advances as if notified, so nothing is owed when the mute ends, which it
// does on its own.
type Mute struct {
	ID      string `json:"id"`
	Device  string `json:"device,omitempty"`
	Type    string `json:"type,omitempty"`
	Start   int64  `json:"start"` // unix ms
	Until   int64  `json:"until"` // unix ms, exclusive
	Comment string `json:"comment,omitempty"`
}

// Covers reports whether m suppresses a notification about device of type
// typ at t (unix ms). Types are compared as they appear in subjects.
func (m Mute) Covers(device, typ string, t int64) bool {
	if t < m.Start || t >= m.Until {
		return false
	}
	if m.Device != "" {
		return m.Device == device
	}
	return dispatch.SanitizeType(m.Type) == dispatch.SanitizeType(typ)
}

// ErrBadMute is returned for a mute that names neither or both of a device
// and a type, or ends before it starts.
var ErrBadMute = errors.New("a mute needs exactly one of device or type, and an end after now")

// AddMute stores m (its ID is assigned; Start defaults to now) and returns it.
func (a *Alarms) AddMute(ctx context.Context, m Mute) (Mute, error) {
	now := a.opts.Now().UnixMilli()
	if m.Start == 0 {
		m.Start = now
	}
	if (m.Device == "") == (m.Type == "") || m.Until <= now || m.Until <= m.Start {
		return Mute{}, ErrBadMute
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	m.ID = hex.EncodeToString(b[:])
	v, err := json.Marshal(m)
	if err != nil {
		return Mute{}, fmt.Errorf("alarm: encode mute: %w", err)
	}
	if err := a.store.Do(ctx, "HSET", []string{a.mutesKey()}, m.ID, string(v)).Error(); err != nil {
		return Mute{}, fmt.Errorf("alarm: store mute: %w", err)
	}
	return m, nil
}

// Mutes returns the mutes that have not ended, earliest end first. Ended
// mutes are deleted on the way.
func (a *Alarms) Mutes(ctx context.Context) ([]Mute, error) {
	all, err := a.readMutes(ctx)
	if err != nil {
		return nil, err
	}
	now := a.opts.Now().UnixMilli()
	out := []Mute{}
	var ended []string
	for _, m := range all {
		if m.Until <= now {
			ended = append(ended, m.ID)
			continue
		}
		out = append(out, m)
	}
	if len(ended) > 0 {
		// Best effort: an ended mute left behind covers nothing.
		_, _ = a.deleteMutes(ctx, ended...)
	}
	slices.SortFunc(out, func(x, y Mute) int {
		return cmp.Or(cmp.Compare(x.Until, y.Until), strings.Compare(x.ID, y.ID))
	})
	return out, nil
}

// RemoveMute deletes a mute and reports whether it existed.
func (a *Alarms) RemoveMute(ctx context.Context, id string) (bool, error) {
	n, err := a.deleteMutes(ctx, id)
	if err != nil {
		return false, fmt.Errorf("alarm: remove mute: %w", err)
	}
	return n == 1, nil
}

// mutesLeaf names the HASH of every mute (mute id -> JSON), in {meta}.
const mutesLeaf = "mutes"

func (a *Alarms) mutesKey() string { return a.store.Keys().Meta(mutesLeaf) }

// deleteMutes deletes the mutes ids and returns how many existed.
func (a *Alarms) deleteMutes(ctx context.Context, ids ...string) (int, error) {
	n, err := a.store.Do(ctx, "HDEL", []string{a.mutesKey()}, ids...).AsInt64()
	return int(n), err
}

func (a *Alarms) readMutes(ctx context.Context) ([]Mute, error) {
	raw, err := a.store.Do(ctx, "HGETALL", []string{a.mutesKey()}).AsStrMap()
	if err != nil {
		return nil, fmt.Errorf("alarm: read mutes: %w", err)
	}
	out := make([]Mute, 0, len(raw))
	for _, v := range raw {
		var m Mute
		if json.Unmarshal([]byte(v), &m) == nil {
			out = append(out, m)
		}
	}
	return out, nil
}

// mute marks the notes a mute covers at now. Mutes are few and
// transitions rare, so they are read for every transition: a mute takes
// effect on every replica at once.
func (a *Alarms) mute(ctx context.Context, notes []Note, now time.Time) error {
	ms, err := a.readMutes(ctx)
	if err != nil || len(ms) == 0 {
		return err
	}
	t := now.UnixMilli()
	for j := range notes {
		for _, m := range ms {
			if m.Covers(notes[j].Device, notes[j].Type, t) {
				notes[j].Muted = true
				break
			}
		}
	}
	return nil
}
