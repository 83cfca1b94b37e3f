package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// burst is scenario 4: n devices whose deadlines all fall due in the same
// second (the same millisecond, the hardest case) → time until every lost
// event is stored in JetStream, against raw JetStream async publishing of n
// messages of the same size.
func (r *runner) burst(ctx context.Context) error {
	n := r.prof.Burst
	sc := Scenario{ID: 4, Name: "burst", Title: "Expiry burst",
		Baselines: []string{fmt.Sprintf("raw JetStream async publish: %d messages of the size of a sigwatch lost event, "+
			"each with its own Nats-Msg-Id, published asynchronously (4,096 pending, as sigwatch's publisher) by one "+
			"client into a stream with the same settings as sigwatch's (file storage, 2-minute de-duplication window); "+
			"timed from the first publish to the last acknowledgement.", n)}}

	// Best of rounds of each, the order alternated between rounds so
	// that neither side always runs on a warmer (or busier) machine.
	var (
		sws, raws, ceils []time.Duration
		body             []byte
		swCPU, ceilCPU   cpuShares
	)
	runSigwatch := func() error {
		d, b, err := r.burstSigwatch(ctx, n)
		if err != nil {
			return fmt.Errorf("sigwatch: %w", err)
		}
		if len(sws) == 0 || d < slices.Min(sws) {
			swCPU = r.burstCPU
		}
		sws, body = append(sws, d), b
		return nil
	}
	runBaselines := func() error {
		d, err := r.burstRaw(ctx, n, body, rawPlain)
		if err != nil {
			return fmt.Errorf("raw jetstream: %w", err)
		}
		raws = append(raws, d)
		d, cpu, err := r.burstCeiling(ctx, n, body)
		if err != nil {
			return fmt.Errorf("ceiling: %w", err)
		}
		if len(ceils) == 0 || d < slices.Min(ceils) {
			ceilCPU = cpu
		}
		ceils = append(ceils, d)
		return nil
	}
	for round := range rounds {
		first, second := runSigwatch, runBaselines
		if round%2 == 1 {
			first, second = runBaselines, runSigwatch
		}
		if err := first(); err != nil {
			return err
		}
		if err := second(); err != nil {
			return err
		}
	}
	r.burstCPU = swCPU
	sw, raw, ceil := slices.Min(sws), slices.Min(raws), slices.Min(ceils)
	f := newFigure(fmt.Sprintf("%s expiries in one second → all lost events in JetStream", groupThousands(int64(n))), "events/s",
		float64(n)/sw.Seconds(), "raw JetStream publish", float64(n)/raw.Seconds(), ratioAtLeast(0.9))
	f.Detail = fmt.Sprintf("best of %d each, the order alternated: sigwatch took %s from the deadline until the stream held all %d events (runs %s); "+
		"raw publishing took %s (runs %s)", rounds, sw.Round(time.Millisecond), n, durations(sws), raw.Round(time.Millisecond), durations(raws))
	sc.Figures = append(sc.Figures, f)
	c := newFigure("claim → publish → remove ceiling with raw clients (the pipeline's own limit)", "events/s",
		float64(n)/ceil.Seconds(), "raw JetStream publish", float64(n)/raw.Seconds())
	c.Detail = fmt.Sprintf("16 loops, one per ZSET, each claiming 256 due members (ZRANGE BYSCORE), publishing them asynchronously "+
		"with Nats-Msg-Id and fence headers and removing them (variadic ZREM) once acknowledged; no registry, marks or lease; "+
		"best of %d (runs %s); %s", rounds, durations(ceils), ceilCPU)
	sc.Figures = append(sc.Figures, c,
		newFigure(fmt.Sprintf("%s expiries → stored events, against the raw ceiling", groupThousands(int64(n))), "events/s",
			float64(n)/sw.Seconds(), "claim → publish → remove ceiling", float64(n)/ceil.Seconds()))
	// What the same raw publishing costs with what sigwatch must add: the
	// fence of a shard on every event, and JetStream's atomic batches.
	variants := []struct {
		mode rawMode
		name string
	}{{rawFenced, "raw publish with a shard's fence headers on each message (diagnostic)"},
		{rawAtomic, "raw atomic batch publish, 1,000 per batch, fence on the first (diagnostic)"},
		{rawFast, "raw fast batch publish, 1,000 per batch, fence on each message (diagnostic)"}}
	took := make([][]time.Duration, len(variants))
	sides := make([]func(int) error, len(variants))
	for j, v := range variants {
		sides[j] = func(int) error {
			d, err := r.burstRaw(ctx, n, body, v.mode)
			if err != nil {
				return fmt.Errorf("raw jetstream, %s: %w", v.mode, err)
			}
			took[j] = append(took[j], d)
			return nil
		}
	}
	if err := alternate(rounds, sides...); err != nil {
		return err
	}
	for j, v := range variants {
		f := newFigure(v.name, "events/s", float64(n)/slices.Min(took[j]).Seconds(), "raw JetStream publish", float64(n)/raw.Seconds())
		f.Detail = fmt.Sprintf("%s (runs %s)", bestOf(rounds), durations(took[j]))
		sc.Figures = append(sc.Figures, f)
	}
	burstCPU := r.burstCPU
	r3, err := r.burstR3(ctx, n, body)
	if err != nil {
		return fmt.Errorf("3 replicas: %w", err)
	}
	sc.Figures = append(sc.Figures, *r3)
	sc.Notes = append(sc.Notes, "While sigwatch fired the burst (1 replica): "+burstCPU.String()+" (the harness process is the scanner).")
	sc.Notes = append(sc.Notes, "Every device is in the registry and in the durable registry (NATS KV); all deadlines are the same "+
		"millisecond. The scanner claims batches of 256 per shard, reads the registry, marks each device lost, publishes "+
		"and compare-and-removes the batch. Losses reach the durable registry by its periodic checkpoint, not per loss.")
	r.res.add(sc)
	return nil
}

// durations lists ds rounded to the millisecond, for a figure's detail.
func durations(ds []time.Duration) string {
	out := make([]string, len(ds))
	for j, d := range ds {
		out[j] = d.Round(time.Millisecond).String()
	}
	return strings.Join(out, ", ")
}

// burstSigwatch times the scanner firing n deadlines that fall due at once.
// It returns the time from the deadline until the stream holds every event,
// and the body of one event (so the baseline publishes the same size).
func (r *runner) burstSigwatch(ctx context.Context, n int) (time.Duration, []byte, error) {
	if err := r.e.flush(ctx); err != nil {
		return 0, nil, err
	}
	keys := shard.NewKeys("sw")
	store := shard.NewStore(r.e.rc, keys)
	ids := deviceIDs(n)
	far := time.Now().Add(10 * time.Minute).UnixMilli()
	r.p.Printf("burst", "sigwatch: loading %d devices", n)
	if err := preload(ctx, store, ids, func(int) int64 { return far }); err != nil {
		return 0, nil, err
	}
	if err := preloadFleet(ctx, store, ids); err != nil {
		return 0, nil, err
	}
	g, err := r.startScanRig(ctx)
	if err != nil {
		return 0, nil, err
	}
	defer g.stop()
	r.p.Printf("burst", "sigwatch: %d devices into the durable registry", n)
	if err := preloadDurable(ctx, g.reg, ids); err != nil {
		return 0, nil, err
	}
	js, err := jetstream.New(r.natsConn())
	if err != nil {
		return 0, nil, err
	}
	stream, err := js.Stream(ctx, "SIGWATCH")
	if err != nil {
		return 0, nil, err
	}
	count := func() uint64 {
		info, err := stream.Info(ctx)
		if err != nil {
			return 0
		}
		return info.State.Msgs
	}
	base := count()

	due := time.Now().Add(1500 * time.Millisecond)
	if err := setDeadlines(ctx, r.e.rc, keys, ids, func(int) int64 { return due.UnixMilli() }); err != nil {
		return 0, nil, err
	}
	if d := time.Until(due); d < 200*time.Millisecond {
		return 0, nil, fmt.Errorf("setting %d deadlines took too long (%s left before they fell due)", n, d)
	}
	r.p.Printf("burst", "sigwatch: %d deadlines fall due at %s", n, due.Format("15:04:05.000"))
	meter := r.newCPUMeter(ctx, nil)
	time.Sleep(time.Until(due))
	s0 := meter.sample()
	stopProf := r.cpuProfile("scanner-burst", fmt.Sprintf("scanner firing %d deadlines due at once (scenario 4)", n))
	var elapsed time.Duration
	next := time.Now().Add(time.Second)
	for {
		c := count() - base
		if c >= uint64(n) {
			elapsed = time.Since(due)
			break
		}
		if time.Since(due) > 2*time.Minute || ctx.Err() != nil {
			stopProf()
			return 0, nil, fmt.Errorf("%d of %d lost events in the stream after %s", c, n, time.Since(due).Round(time.Second))
		}
		if time.Now().After(next) {
			r.p.Printf("burst", "sigwatch: %d/%d lost events in JetStream", c, n)
			next = next.Add(time.Second)
		}
		time.Sleep(20 * time.Millisecond)
	}
	shares := meter.since(s0)
	stopProf()
	r.p.Printf("burst", "sigwatch: all %d lost events in JetStream %s after the deadline (%.0f/s); %s", n,
		elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), shares)
	r.burstCPU = shares

	// One stored event, for the baseline's message size.
	msg, err := stream.GetLastMsgForSubject(ctx, "sigwatch.lost.>")
	if err != nil {
		return 0, nil, fmt.Errorf("read a lost event back: %w", err)
	}
	return elapsed, msg.Data, nil
}

// rawMode is how the raw baseline publishes.
type rawMode string

const (
	rawPlain  rawMode = "Nats-Msg-Id"
	rawFenced rawMode = "Nats-Msg-Id and fence headers"
	rawAtomic rawMode = "atomic batches"
	rawFast   rawMode = "fast batches"
)

// atomicBatch is the size of the atomic batches (the server's default
// limit).
const atomicBatch = 1000

// burstRaw times publishing n messages of body's size into a JetStream
// stream configured as sigwatch's, from the first publish to the last ack:
// each with its own Nats-Msg-Id; with rawFenced also with the headers of a
// shard's fence (as sigwatch's scanner sends them); with rawAtomic in
// atomic batches whose first message checks the fence.
func (r *runner) burstRaw(ctx context.Context, n int, body []byte, mode rawMode) (time.Duration, error) {
	js, err := jetstream.New(r.natsConn(), jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return 0, err
	}
	const name = "BENCHRAW"
	if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, err
	}
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{"benchraw.>"},
		Storage: jetstream.FileStorage, Replicas: r.replicas(), Duplicates: 2 * time.Minute, AllowAtomicPublish: mode == rawAtomic,
		AllowBatchPublish: mode == rawFast})
	if err != nil {
		return 0, err
	}
	defer js.DeleteStream(context.WithoutCancel(ctx), name)
	fence, err := js.Publish(ctx, "benchraw.fence.deadlines.0", []byte(`{}`))
	if err != nil {
		return 0, err
	}
	fenceSeq := strconv.FormatUint(fence.Sequence, 10)
	r.p.Printf("burst", "raw (%s): publishing %d messages of %d bytes", mode, n, len(body))
	subject := "benchraw.lost." + dispatch.SanitizeType("")
	if mode == rawFast {
		return r.burstRawFast(ctx, stream, n, body, subject, fenceSeq)
	}
	start := time.Now()
	var commits []chan *nats.Msg
	for j := range n {
		m := nats.NewMsg(subject)
		m.Data = body
		id := fmt.Sprintf("%s@%d", deviceID(j), start.UnixMilli())
		if mode == rawFenced || mode == rawAtomic && j%atomicBatch == 0 {
			m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, fenceSeq)
			m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, "benchraw.fence.deadlines.0")
		}
		if mode != rawAtomic {
			if err := publishAsync(ctx, js, m, jetstream.WithMsgID(id)); err != nil {
				return 0, err
			}
			continue
		}
		m.Header.Set(jetstream.MsgIDHeader, id)
		m.Header.Set("Nats-Batch-Id", fmt.Sprint("b", j/atomicBatch))
		m.Header.Set("Nats-Batch-Sequence", strconv.Itoa(j%atomicBatch+1))
		if j%atomicBatch == atomicBatch-1 || j == n-1 {
			m.Header.Set("Nats-Batch-Commit", "1")
			m.Reply = nats.NewInbox()
			ch := make(chan *nats.Msg, 1)
			sub, err := r.natsConn().ChanSubscribe(m.Reply, ch)
			if err != nil {
				return 0, err
			}
			defer sub.Unsubscribe()
			commits = append(commits, ch)
		}
		if err := r.natsConn().PublishMsg(m); err != nil {
			return 0, err
		}
	}
	for _, ch := range commits {
		select {
		case ack := <-ch:
			var resp struct {
				Error *struct {
					Description string `json:"description"`
				} `json:"error"`
			}
			if json.Unmarshal(ack.Data, &resp) == nil && resp.Error != nil {
				return 0, fmt.Errorf("atomic batch refused: %s", resp.Error.Description)
			}
		case <-time.After(2 * time.Minute):
			return 0, fmt.Errorf("a batch commit still unacknowledged after 2 minutes")
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(2 * time.Minute):
		return 0, fmt.Errorf("acks still pending after 2 minutes")
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return r.rawDone(ctx, stream, n, start, mode)
}

// rawDone is the end of a raw run started at start: the time it took, once
// the stream is seen to hold the n messages and the fence.
func (r *runner) rawDone(ctx context.Context, stream jetstream.Stream, n int, start time.Time, mode rawMode) (time.Duration, error) {
	elapsed := time.Since(start)
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, err
	}
	if info.State.Msgs != uint64(n)+1 {
		return 0, fmt.Errorf("stream holds %d messages, want %d", info.State.Msgs, n+1)
	}
	r.p.Printf("burst", "raw (%s): %d messages acked in %s (%.0f/s)", mode, n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds())
	return elapsed, nil
}

// burstRawFast is burstRaw in the fast batches of nats-server 2.14+, each
// message with its Nats-Msg-Id and the fence.
func (r *runner) burstRawFast(ctx context.Context, stream jetstream.Stream, n int, body []byte, subject, fenceSeq string) (time.Duration, error) {
	start := time.Now()
	err := publishFast(ctx, r.natsConn(), n, func(j int) *nats.Msg {
		m := nats.NewMsg(subject)
		m.Data = body
		m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("%s@%d", deviceID(j), start.UnixMilli()))
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, fenceSeq)
		m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, "benchraw.fence.deadlines.0")
		return m
	})
	if err != nil {
		return 0, err
	}
	return r.rawDone(ctx, stream, n, start, rawFast)
}

// publishFast publishes msg(0..n-1) in the fast batches of nats-server
// 2.14+ into a stream that allows them: one batch per atomicBatch
// messages, a gap ends the batch, the server acknowledges every flow
// messages instead of each one, and up to fastInflight batches are in
// flight. It returns once every batch's commit is acknowledged.
func publishFast(ctx context.Context, nc *nats.Conn, n int, msg func(j int) *nats.Msg) error {
	const flow, fastInflight = 100, 8
	prefix := nats.NewInbox()
	type reply struct {
		Type  string `json:"type"`
		Count int    `json:"count"`
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	done := make(chan reply, n/atomicBatch+1)
	sub, err := nc.Subscribe(prefix+".>", func(m *nats.Msg) {
		var rp reply
		if json.Unmarshal(m.Data, &rp) != nil {
			rp.Type = "err"
		}
		// Flow acks and gaps have a type; the batch's end is a PubAck.
		if rp.Type == "" || rp.Type == "err" {
			done <- rp
		}
	})
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	batches, ended := 0, 0
	wait := func() error {
		select {
		case rp := <-done:
			ended++
			if rp.Error != nil {
				return fmt.Errorf("fast batch refused: %s", rp.Error.Description)
			}
			return nil
		case <-time.After(2 * time.Minute):
			return fmt.Errorf("a fast batch commit still unacknowledged after 2 minutes")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for j := range n {
		seq, last := j%atomicBatch+1, j%atomicBatch == atomicBatch-1 || j == n-1
		if seq == 1 {
			batches++
			if batches-ended > fastInflight {
				if err := wait(); err != nil {
					return err
				}
			}
		}
		op := 1 // append
		switch {
		case last:
			op = 2 // store and commit
		case seq == 1:
			op = 0 // start
		}
		m := msg(j)
		m.Reply = fmt.Sprintf("%s.b%d.%d.fail.%d.%d.$FI", prefix, j/atomicBatch, flow, seq, op)
		if err := nc.PublishMsg(m); err != nil {
			return err
		}
	}
	for ended < batches {
		if err := wait(); err != nil {
			return err
		}
	}
	return nil
}
