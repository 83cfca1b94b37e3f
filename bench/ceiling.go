package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ceilingBatch is the claim size of the ceiling's loops: the scanner's.
const ceilingBatch = 256

// burstCeiling times the firing pipeline written with raw clients, the
// least any design on this store and this stream must do per expiry: n
// members of 16 ZSETs, all due, and one loop per ZSET that claims up to 256
// due members (ZRANGE BYSCORE), publishes each asynchronously with its
// Nats-Msg-Id and a shard's fence headers into a stream configured as
// sigwatch's, waits for the acknowledgements and removes the batch (one
// variadic ZREM). No registry, no marks, no lease: it is the pipeline's own
// limit on this machine. Timed from the first claim until the stream holds
// every message.
func (r *runner) burstCeiling(ctx context.Context, n int, body []byte) (time.Duration, cpuShares, error) {
	js, err := jetstream.New(r.natsConn(), jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return 0, nil, err
	}
	const name = "BENCHCEIL"
	if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil, err
	}
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{"benchceil.>"},
		Storage: jetstream.FileStorage, Replicas: r.replicas(), Duplicates: 2 * time.Minute})
	if err != nil {
		return 0, nil, err
	}
	defer js.DeleteStream(context.WithoutCancel(ctx), name)

	rc := r.e.rc
	key := func(i int) string { return "benchceil:{" + strconv.Itoa(i) + "}:due" }
	fenceSubj := func(i int) string { return "benchceil.fence." + strconv.Itoa(i) }
	fences := make([]string, shards)
	for i := range shards {
		ack, err := js.Publish(ctx, fenceSubj(i), []byte(`{}`))
		if err != nil {
			return 0, nil, err
		}
		fences[i] = strconv.FormatUint(ack.Sequence, 10)
		defer rc.Do(context.WithoutCancel(ctx), rc.B().Del().Key(key(i)).Build())
	}
	due := time.Now().UnixMilli()
	err = parallelChunks(ctx, n, 1000, 4, func(lo, hi int) error {
		by := map[int][]string{}
		for j := lo; j < hi; j++ {
			id := deviceID(j)
			by[j%shards] = append(by[j%shards], id)
		}
		for i, ids := range by {
			cmd := rc.B().Zadd().Key(key(i)).ScoreMember()
			for _, id := range ids {
				cmd = cmd.ScoreMember(float64(due), id)
			}
			if err := rc.Do(ctx, cmd.Build()).Error(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	r.p.Printf("burst", "ceiling: %d due members in %d ZSETs; claiming, publishing and removing", n, shards)

	meter := r.newCPUMeter(ctx, nil)
	s0 := meter.sample()
	start := time.Now()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if first == nil {
			first = err
		}
	}
	for i := range shards {
		wg.Go(func() {
			subject := "benchceil.lost." + strconv.Itoa(i)
			for ctx.Err() == nil {
				ids, err := rc.Do(ctx, rc.B().Zrange().Key(key(i)).Min("-inf").Max(strconv.FormatInt(due, 10)).
					Byscore().Limit(0, ceilingBatch).Build()).AsStrSlice()
				if err != nil {
					fail(err)
					return
				}
				if len(ids) == 0 {
					return
				}
				futures := make([]jetstream.PubAckFuture, 0, len(ids))
				for _, id := range ids {
					m := nats.NewMsg(subject)
					m.Data = body
					m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, fences[i])
					m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, fenceSubj(i))
					f, err := publishAsyncFuture(ctx, js, m, jetstream.WithMsgID(id+"@"+strconv.FormatInt(due, 10)))
					if err != nil {
						fail(err)
						return
					}
					futures = append(futures, f)
				}
				for _, f := range futures {
					select {
					case <-f.Ok():
					case err := <-f.Err():
						fail(err)
						return
					case <-ctx.Done():
						return
					}
				}
				if err := rc.Do(ctx, rc.B().Zrem().Key(key(i)).Member(ids...).Build()).Error(); err != nil {
					fail(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	shares := meter.since(s0)
	if first != nil {
		return 0, nil, first
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, nil, err
	}
	if want := uint64(n + shards); info.State.Msgs != want {
		return 0, nil, fmt.Errorf("ceiling: stream holds %d messages, want %d", info.State.Msgs, want)
	}
	r.p.Printf("burst", "ceiling: %d claimed, stored and removed in %s (%.0f/s); %s", n, elapsed.Round(time.Millisecond),
		float64(n)/elapsed.Seconds(), shares)
	return elapsed, shares, nil
}
