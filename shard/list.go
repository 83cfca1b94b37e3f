package shard

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/rueidis"
)

// The device listings: every watched device, shard by shard, then every
// lost one, partition by partition, paged as pager.go pages.

// ListedDevice is one row of a device listing.
type ListedDevice struct {
	Device string `json:"device"`
	Type   string `json:"type"`
	Group  string `json:"group,omitempty"`
	State  string `json:"state"` // watched or lost
	// Deadline is the device's deadline while watched, the deadline it was
	// declared lost at while lost; LastSeen is Deadline - ThresholdMS.
	Deadline    int64 `json:"deadline"`
	LastSeen    int64 `json:"last_seen"`
	LostAt      int64 `json:"lost_at,omitempty"`
	ThresholdMS int64 `json:"threshold_ms"`
}

// DeviceQuery selects a page of devices: State is ListWatched, ListLost or
// "" (every known device: the watched ones, then the lost ones), Type a
// type to keep ("" any), Limit at most MaxListLimit (0: 100), Cursor the
// "next" of the previous page.
type DeviceQuery struct {
	State, Type, Cursor string
	Limit               int
}

// ErrBadQuery is returned for a listing query out of range.
var ErrBadQuery = errors.New("bad listing query")

// refusal is a caller's mistake as the API shows it: errors.Is finds its
// sentinel, and its text is the detail alone, in the caller's words.
type refusal struct {
	is  error
	msg string
}

func (r *refusal) Error() string { return r.msg }
func (r *refusal) Unwrap() error { return r.is }

// Refuse returns the refusal of kind is, saying format: a caller's
// mistake whose text the API shows as it is, with errors.Is finding is.
func Refuse(is error, format string, args ...any) error {
	return &refusal{is: is, msg: fmt.Sprintf(format, args...)}
}

// List returns one page of devices and the cursor of the next ("" on the
// last page). See the top of this file for what paging guarantees.
func (d *Devices) List(ctx context.Context, q DeviceQuery) ([]ListedDevice, string, error) {
	if q.Limit == 0 {
		q.Limit = 100
	}
	if q.Limit < 0 || q.Limit > MaxListLimit {
		return nil, "", Refuse(ErrBadQuery, "limit %d: give 1 to %d", q.Limit, MaxListLimit)
	}
	var kinds []string
	switch q.State {
	case ListWatched:
		kinds = []string{ListWatched}
	case ListLost:
		kinds = []string{ListLost}
	case "":
		kinds = []string{ListWatched, ListLost}
	default:
		return nil, "", Refuse(ErrBadQuery, "state %q: give watched or lost, or none for both", q.State)
	}
	cur, err := decodeCursor(q.Cursor, kinds...)
	if err != nil {
		return nil, "", err
	}
	var rows []ListedDevice
	for {
		var got []ListedDevice
		var next string
		if cur.Kind == ListWatched {
			got, next, err = d.listWatched(ctx, q.Type, cur, q.Limit-len(rows))
		} else {
			got, next, err = d.listLost(ctx, q.Type, cur, q.Limit-len(rows))
		}
		if err != nil {
			return nil, "", err
		}
		rows = append(rows, got...)
		if next != "" || cur.Kind != ListWatched || q.State != "" {
			return d.withGroups(ctx, rows, next)
		}
		// Every known device: the lost ones follow the watched ones.
		cur = listCursor{V: cursorVersion, Kind: ListLost}
		if len(rows) == q.Limit {
			return d.withGroups(ctx, rows, cur.encode())
		}
	}
}

// withGroups fills in the groups of a page's rows, in one round trip.
func (d *Devices) withGroups(ctx context.Context, rows []ListedDevice, next string) ([]ListedDevice, string, error) {
	ids := make([]string, len(rows))
	for j, r := range rows {
		ids[j] = r.Device
	}
	gs, err := d.store.Groups(ctx, ids)
	if err != nil {
		return nil, "", err
	}
	for j := range rows {
		rows[j].Group = gs[j]
	}
	return rows, next, nil
}

// listWatched pages through the deadline ZSETs.
func (d *Devices) listWatched(ctx context.Context, typ string, cur listCursor, limit int) ([]ListedDevice, string, error) {
	// The topology is read from Redis, not the watcher, at the start and
	// again before the listing ends: a doubling the watcher has not seen
	// yet would end it before the new shards.
	listTrips.Add(1)
	t, err := d.topo.Refresh(ctx)
	if err != nil {
		return nil, "", err
	}
	if cur.Shards == 0 {
		cur.Shards = t.Shards
	}
	n := func(ctx context.Context, last bool) (int, error) {
		if last {
			listTrips.Add(1)
			var err error
			if t, err = d.topo.Refresh(ctx); err != nil {
				return 0, err
			}
		}
		return max(t.Shards, cur.Shards), nil
	}
	src := scanSource{key: func(i int) string { return d.store.k.Timers(Deadlines, i) }, zset: true}
	keep := func(ctx context.Context, es []elem) ([]ListedDevice, []bool, error) {
		if len(es) == 0 {
			return nil, nil, nil
		}
		// One round trip: each row's type and, for a member left in its
		// old shard by a draining doubling, its score in its new shard.
		b := d.store.c.B()
		cmds := make(rueidis.Commands, 0, 2*len(es))
		moved := make([]int, len(es))
		for j, e := range es {
			cmds = append(cmds, b.Hget().Key(d.store.k.Registry(e.id)).Field(e.id).Build())
			moved[j] = -1
			if home := Of(e.id, max(t.Shards, cur.Shards)); home != e.src {
				moved[j] = len(cmds)
				cmds = append(cmds, b.Zscore().Key(d.store.k.Timers(Deadlines, home)).Member(e.id).Build())
			}
		}
		listTrips.Add(1)
		rs := d.store.c.DoMulti(ctx, cmds...)
		codes := make([]string, len(es))
		ok := make([]bool, len(es))
		k := 0
		for j := range es {
			v, err := rs[k].ToString()
			if err != nil && !rueidis.IsRedisNil(err) {
				return nil, nil, fmt.Errorf("shard: list: read registry: %w", err)
			}
			if validCode(v) {
				codes[j] = v
			}
			k++
			ok[j] = true
			if moved[j] >= 0 {
				if _, err := rs[k].ToString(); err == nil {
					ok[j] = false // listed from its new shard
				} else if !rueidis.IsRedisNil(err) {
					return nil, nil, fmt.Errorf("shard: list: read score: %w", err)
				}
				k++
			}
		}
		return d.rows(ctx, es, codes, typ, ok, func(_ int, e elem, typeName string, thr int64) ListedDevice {
			dl, _ := strconv.ParseFloat(e.val, 64)
			return ListedDevice{Device: e.id, Type: typeName, State: ListWatched, Deadline: int64(dl),
				LastSeen: int64(dl) - thr, ThresholdMS: thr}
		})
	}
	return page(ctx, d.store, src, cur, limit, 16, n, keep)
}

// listLost pages through the lost marks, each counted as Get counts it
// (lostCounts).
func (d *Devices) listLost(ctx context.Context, typ string, cur listCursor, limit int) ([]ListedDevice, string, error) {
	var t Topology
	n := func(ctx context.Context, last bool) (int, error) {
		t = d.topo.Current()
		return registryParts, nil
	}
	src := scanSource{key: func(p int) string { return d.store.k.partKeyAt(p, "lost") }}
	keep := func(ctx context.Context, es []elem) ([]ListedDevice, []bool, error) {
		if len(es) == 0 {
			return nil, nil, nil
		}
		b := d.store.c.B()
		cmds := make(rueidis.Commands, 0, 3*len(es))
		at := make([]int, len(es)+1)
		for j, e := range es {
			at[j] = len(cmds)
			cmds = append(cmds, b.Hget().Key(d.store.k.Registry(e.id)).Field(e.id).Build())
			cmds = append(cmds, d.store.deadlineCmds(t, e.id)...)
		}
		at[len(es)] = len(cmds)
		listTrips.Add(1)
		rs := d.store.c.DoMulti(ctx, cmds...)
		codes := make([]string, len(es))
		ok := make([]bool, len(es))
		marks := make([][2]int64, len(es))
		for j, e := range es {
			v, err := rs[at[j]].ToString()
			if err != nil && !rueidis.IsRedisNil(err) {
				return nil, nil, fmt.Errorf("shard: list: read registry: %w", err)
			}
			if validCode(v) {
				codes[j] = v
			}
			dl, lostAt, err := parseLostMark(e.val)
			marks[j] = [2]int64{dl, lostAt}
			cur, lerr := deadlineOf(t.Locate(e.id), rs[at[j]+1:at[j+1]])
			if lerr != nil {
				return nil, nil, fmt.Errorf("shard: list: %w", lerr)
			}
			ok[j] = err == nil && lostCounts(dl, cur)
		}
		return d.rows(ctx, es, codes, typ, ok, func(j int, e elem, typeName string, thr int64) ListedDevice {
			return ListedDevice{Device: e.id, Type: typeName, State: ListLost, Deadline: marks[j][0],
				LastSeen: marks[j][0] - thr, LostAt: marks[j][1], ThresholdMS: thr}
		})
	}
	return page(ctx, d.store, src, cur, limit, 512, n, keep)
}

// rows turns a page of listed devices into rows: each device's type is
// named from its code, a device not of typ (when typ is set) is unmarked in
// ok, and row makes the row from the device's type and threshold in ms.
func (d *Devices) rows(ctx context.Context, es []elem, codes []string, typ string, ok []bool,
	row func(j int, e elem, typeName string, thr int64) ListedDevice) ([]ListedDevice, []bool, error) {
	types, err := d.store.typeNames(ctx, codes)
	if err != nil {
		return nil, nil, err
	}
	rows := make([]ListedDevice, len(es))
	for j, e := range es {
		if typ != "" && types[j] != typ {
			ok[j] = false
		}
		rows[j] = row(j, e, types[j], d.thr.For(e.id, types[j]).Milliseconds())
	}
	return rows, ok, nil
}
