package bench

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sigwatch/sigwatch/internal/periodic"
	"github.com/sigwatch/sigwatch/shard"
)

const (
	// asynqWorkers reschedule asynq tasks concurrently; asynq has no batch
	// API, so its throughput comes from concurrency.
	asynqWorkers = 64
	// pgWorkers send one set-based UPDATE of pgBatch resets at a time each.
	pgWorkers = 16
	pgBatch   = writeBatch
)

// peers is scenario 6: resets/s of sigwatch against the designs users would
// pick instead: asynq (reschedule = delete + enqueue with ProcessAt) and a
// PostgreSQL scan table (UPDATE per signal, SELECT ... FOR UPDATE SKIP
// LOCKED poller), each over the same number of timers.
func (r *runner) peers(ctx context.Context) error {
	n := r.prof.PeerDevices
	sc := Scenario{ID: 6, Name: "peers", Title: "Reset throughput against peers",
		Baselines: []string{
			fmt.Sprintf("asynq %s: %d scheduled tasks (task id = device id); a reset deletes the task "+
				"(`Inspector.DeleteTask`) and enqueues it again with `ProcessAt` = now + 10 min, from %d goroutines "+
				"(each owning its own ids, so no reset conflicts with another) on a connection pool of the same size; asynq has "+
				"no batch API. Its server is not running: nothing falls due in the window.", r.versionOf("asynq"), n, asynqWorkers),
			fmt.Sprintf("PostgreSQL scan table: `timers(id text primary key, deadline bigint)` with an index on deadline, %d "+
				"rows; resets go out as one set-based `UPDATE timers t SET deadline = greatest(t.deadline, $1) FROM "+
				"unnest($2::text[]) AS u(id) WHERE t.id = u.id` per batch, from %d connections, %d resets a batch (the "+
				"batch size of sigwatch's writers; ids sorted, so batches never deadlock), with "+
				"`synchronous_commit = off`; a poller runs `SELECT ... WHERE deadline <= now ORDER BY deadline LIMIT 256 "+
				"FOR UPDATE SKIP LOCKED` + `DELETE` every 20 ms, as sigwatch's scanner polls.", n, pgWorkers, pgBatch),
		}}
	ids := deviceIDs(n)

	// Every side is measured rounds times, the order rotated each round;
	// each figure keeps a side's best run.
	var sws, aqs, pgs, aofs []measured
	pgReason := ""
	err := alternate(rounds, func(int) error {
		m, err := r.peerSigwatch(ctx, ids)
		if err != nil {
			return fmt.Errorf("sigwatch: %w", err)
		}
		sws = append(sws, m)
		return nil
	}, func(int) error {
		m, err := r.peerAsynq(ctx, ids)
		if err != nil {
			return fmt.Errorf("asynq: %w", err)
		}
		aqs = append(aqs, m)
		return nil
	}, func(int) error {
		if pgReason != "" {
			return nil
		}
		m, reason, err := r.peerPostgres(ctx, ids)
		switch {
		case err != nil:
			return fmt.Errorf("postgresql: %w", err)
		case reason != "":
			pgReason = reason
			r.p.Printf("peers", "PostgreSQL not measured: %s", reason)
			return nil
		}
		pgs = append(pgs, m)
		return nil
	}, func(int) error {
		// Only compared with PostgreSQL: without it, not worth the time.
		if pgReason != "" {
			return nil
		}
		// The same durability on both sides: PostgreSQL writes its WAL
		// asynchronously (synchronous_commit=off), Redis its AOF every
		// second, as docs/durability.md asks of production.
		m, err := r.withAOF(ctx, func() (measured, error) { return r.peerSigwatch(ctx, ids) })
		if err != nil {
			return fmt.Errorf("sigwatch with AOF: %w", err)
		}
		aofs = append(aofs, m)
		return nil
	})
	if err != nil {
		return err
	}
	sw, aq := peerBest(sws), peerBest(aqs)
	f := newFigure("resets/s vs asynq", "/s", sw.Rate, "asynq delete + enqueue", aq.Rate, ratioAtLeast(5))
	f.Detail = fmt.Sprintf("best of %d each, the order alternated: sigwatch runs %s; asynq runs %s; in the best runs, client CPU "+
		"%.2f vs %.2f µs per reset, Redis CPU %.2f vs %.2f µs per reset; asynq errors %d over its %d runs",
		rounds, peerRates(sws), peerRates(aqs), sw.ClientCPUus, aq.ClientCPUus, sw.RedisCPUus, aq.RedisCPUus, peerErrors(aqs), len(aqs))
	sc.Figures = append(sc.Figures, f)

	if pgReason != "" {
		sc.Notes = append(sc.Notes, "PostgreSQL not measured: "+pgReason)
	} else {
		pg, aof := peerBest(pgs), peerBest(aofs)
		f := newFigure("resets/s vs PostgreSQL", "/s", sw.Rate, "PostgreSQL set-based UPDATE", pg.Rate)
		f.Detail = fmt.Sprintf("best of %d each, the order alternated: sigwatch runs %s; PostgreSQL runs %s; in the best runs, "+
			"client CPU %.2f vs %.2f µs per reset; PostgreSQL failed batches %d over its %d runs; Redis without AOF",
			rounds, peerRates(sws), peerRates(pgs), sw.ClientCPUus, pg.ClientCPUus, peerErrors(pgs), len(pgs))
		sc.Figures = append(sc.Figures, f)
		fa := newFigure("resets/s vs PostgreSQL, Redis with AOF everysec", "/s", aof.Rate, "PostgreSQL set-based UPDATE", pg.Rate)
		fa.Detail = fmt.Sprintf("best of %d each, the order alternated: sigwatch with AOF runs %s; PostgreSQL runs %s; Redis "+
			"appendonly yes, appendfsync everysec; PostgreSQL synchronous_commit=off (its WAL flushed by the WAL writer); "+
			"in the best run, client CPU %.2f µs, Redis CPU %.2f µs per reset", rounds, peerRates(aofs), peerRates(pgs),
			aof.ClientCPUus, aof.RedisCPUus)
		sc.Figures = append(sc.Figures, fa)
	}
	sc.Notes = append(sc.Notes, fmt.Sprintf("sigwatch resets are store.Upsert batches of %d random ids from %d goroutines "+
		"(as in scenario 2) over %d timers, with the scanner running.", writeBatch, writeWriters, n),
		fmt.Sprintf("Each side ran %d times for %s, the order rotated each round (sigwatch, asynq, PostgreSQL, sigwatch with "+
			"AOF); every run starts from an emptied Redis, and every PostgreSQL run from a server and a table of its own.",
			rounds, r.prof.PeerFor))
	r.res.add(sc)
	return nil
}

func (r *runner) versionOf(name string) string { return r.res.Machine.Versions[name] }

// peerBest is the run of the highest rate.
func peerBest(ms []measured) measured {
	return slices.MaxFunc(ms, func(a, b measured) int { return cmp.Compare(a.Rate, b.Rate) })
}

// peerRates lists the runs' rates, for a figure's detail.
func peerRates(ms []measured) string {
	vs := make([]float64, len(ms))
	for j, m := range ms {
		vs[j] = math.Round(m.Rate)
	}
	return runs(vs, "/s")
}

// peerErrors is the errors of all runs.
func peerErrors(ms []measured) int64 {
	var n int64
	for _, m := range ms {
		n += m.Errors
	}
	return n
}

// withAOF runs f with Redis appending to its AOF every second, once the
// rewrite that turning it on starts is done, and turns it off afterwards.
func (r *runner) withAOF(ctx context.Context, f func() (measured, error)) (measured, error) {
	set := func(k1, v1, k2, v2 string) error {
		return r.e.rc.Do(ctx, r.e.rc.B().ConfigSet().ParameterValue().ParameterValue(k1, v1).ParameterValue(k2, v2).Build()).Error()
	}
	if err := set("appendfsync", "everysec", "appendonly", "yes"); err != nil {
		return measured{}, err
	}
	defer set("appendonly", "no", "appendfsync", "everysec")
	ok := waitFor(ctx, time.Minute, func() bool {
		m, err := r.e.redisInfo(ctx, "persistence")
		return err == nil && m["aof_enabled"] == "1" && m["aof_rewrite_in_progress"] == "0" && m["aof_rewrite_scheduled"] == "0"
	})
	if !ok {
		return measured{}, fmt.Errorf("the AOF rewrite did not finish within a minute")
	}
	return f()
}

// peerSigwatch measures sigwatch's resets over ids, with the scanner up.
func (r *runner) peerSigwatch(ctx context.Context, ids []string) (measured, error) {
	if err := r.e.flush(ctx); err != nil {
		return measured{}, err
	}
	store := shard.NewStore(r.e.rc, shard.NewKeys("sw"))
	far := time.Now().Add(10 * time.Minute).UnixMilli()
	if err := preload(ctx, store, ids, func(int) int64 { return far }); err != nil {
		return measured{}, err
	}
	g, err := r.startScanRig(ctx)
	if err != nil {
		return measured{}, err
	}
	defer g.stop()
	write, err := r.sigwatchWriter(ctx, store)
	if err != nil {
		return measured{}, err
	}
	m := r.measureWrites(ctx, &writeLoad{ids: ids, writers: writeWriters, batch: writeBatch, ahead: 10 * time.Minute,
		write: write}, r.prof.PeerFor)
	r.p.Printf("peers", "sigwatch: %.0f resets/s over %d timers", m.Rate, len(ids))
	return m, nil
}

// peerAsynq measures asynq reschedules over ids.
func (r *runner) peerAsynq(ctx context.Context, ids []string) (measured, error) {
	if err := r.e.flush(ctx); err != nil {
		return measured{}, err
	}
	opt := asynq.RedisClientOpt{Addr: r.e.redis.Addr, PoolSize: asynqWorkers}
	client := asynq.NewClient(opt)
	defer client.Close()
	insp := asynq.NewInspector(opt)
	defer insp.Close()
	const queue = "default"
	task := asynq.NewTask("lost", nil)
	at := time.Now().Add(10 * time.Minute)
	r.p.Printf("peers", "asynq: scheduling %d tasks", len(ids))
	if err := parallelChunks(ctx, len(ids), 1, asynqWorkers, func(j, _ int) error {
		_, err := client.EnqueueContext(ctx, task, asynq.TaskID(ids[j]), asynq.ProcessAt(at), asynq.Queue(queue))
		return err
	}); err != nil {
		return measured{}, err
	}
	mctx, cancel := context.WithTimeout(ctx, r.prof.PeerFor)
	defer cancel()
	var done, errs atomic.Int64
	meter := r.e.redisCPU(ctx)
	cpu0, t0 := processCPU(), time.Now()
	var wg sync.WaitGroup
	for k := range asynqWorkers {
		wg.Go(func() {
			for j := k; mctx.Err() == nil; j += asynqWorkers {
				id := ids[j%len(ids)]
				if err := insp.DeleteTask(queue, id); err != nil {
					errs.Add(1)
					continue
				}
				if _, err := client.EnqueueContext(mctx, task, asynq.TaskID(id), asynq.Queue(queue),
					asynq.ProcessAt(time.Now().Add(10*time.Minute))); err != nil {
					if mctx.Err() == nil {
						errs.Add(1)
					}
					continue
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	el := time.Since(t0)
	m := newMeasured(done.Load(), errs.Load(), el, processCPU()-cpu0, r.e.redisCPU(ctx)-meter)
	r.p.Printf("peers", "asynq: %.0f resets/s (%d errors)", m.Rate, m.Errors)
	return m, r.e.flush(ctx)
}

// peerPostgres measures set-based UPDATEs of a PostgreSQL scan table. A
// non-empty reason says why PostgreSQL was not measured.
func (r *runner) peerPostgres(ctx context.Context, ids []string) (measured, string, error) {
	pg, reason, err := startPostgres(r.e.dir)
	if err != nil || reason != "" {
		return measured{}, reason, err
	}
	defer pg.stop()
	r.res.Machine.Versions["postgresql"] = pg.version
	cfg, err := pgxpool.ParseConfig(pg.dsn)
	if err != nil {
		return measured{}, "", err
	}
	cfg.MaxConns = pgWorkers + 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return measured{}, "", err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE timers (id text PRIMARY KEY, deadline bigint NOT NULL);
		CREATE INDEX timers_deadline ON timers (deadline)`); err != nil {
		return measured{}, "", err
	}
	// Loaded deadlines stay below far+len(ids); every reset sets one
	// above it, which lets the check below see that resets landed.
	far := time.Now().Add(5 * time.Minute).UnixMilli()
	r.p.Printf("peers", "postgresql %s: loading %d rows", pg.version, len(ids))
	if _, err := pool.CopyFrom(ctx, pgx.Identifier{"timers"}, []string{"id", "deadline"},
		pgx.CopyFromSlice(len(ids), func(j int) ([]any, error) { return []any{ids[j], far + int64(j)}, nil })); err != nil {
		return measured{}, "", err
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE timers"); err != nil {
		return measured{}, "", err
	}

	mctx, cancel := context.WithTimeout(ctx, r.prof.PeerFor)
	defer cancel()
	var done, errs, polled atomic.Int64
	var wg sync.WaitGroup
	// The poller: what a PostgreSQL-based design runs to fire expired
	// timers. Nothing is due in the window, so it costs little, as
	// sigwatch's idle scanner does.
	wg.Go(func() {
		periodic.Run(mctx, 20*time.Millisecond, func(now time.Time) {
			err := pgx.BeginFunc(mctx, pool, func(tx pgx.Tx) error {
				rows, err := tx.Query(mctx, `SELECT id FROM timers WHERE deadline <= $1 ORDER BY deadline
					LIMIT 256 FOR UPDATE SKIP LOCKED`, now.UnixMilli())
				if err != nil {
					return err
				}
				due, err := pgx.CollectRows(rows, pgx.RowTo[string])
				if err != nil || len(due) == 0 {
					return err
				}
				_, err = tx.Exec(mctx, `DELETE FROM timers WHERE id = ANY($1)`, due)
				return err
			})
			if err == nil {
				polled.Add(1)
			}
		})
	})
	cpu0, t0 := processCPU(), time.Now()
	pgCPU0 := pg.cpu()
	for k := range pgWorkers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(k)+1, uint64(t0.UnixNano())))
			batchIDs := make([]string, pgBatch)
			for mctx.Err() == nil {
				for j := range batchIDs {
					batchIDs[j] = ids[rng.IntN(len(ids))]
				}
				slices.Sort(batchIDs)
				dl := time.Now().Add(10 * time.Minute).UnixMilli()
				if _, err := pool.Exec(mctx, `UPDATE timers t SET deadline = greatest(t.deadline, $1)
					FROM unnest($2::text[]) AS u(id) WHERE t.id = u.id`, dl, batchIDs); err != nil {
					if mctx.Err() == nil {
						errs.Add(1)
					}
					continue
				}
				done.Add(pgBatch)
			}
		})
	}
	wg.Wait()
	el := time.Since(t0)
	m := newMeasured(done.Load(), errs.Load(), el, processCPU()-cpu0, pg.cpu()-pgCPU0)
	// The resets really moved deadlines: rows loaded at far+j now hold a
	// deadline set during the measurement.
	var moved int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM timers WHERE deadline > $1", far+int64(len(ids))).Scan(&moved); err != nil {
		return measured{}, "", err
	}
	if moved == 0 {
		return measured{}, "", fmt.Errorf("no row's deadline moved after %d resets", m.Ops)
	}
	r.p.Printf("peers", "postgresql: %.0f resets/s (%d failed batches, server CPU %.1f µs per reset, %d polls, %d rows moved)",
		m.Rate, m.Errors, m.RedisCPUus, polled.Load(), moved)
	return m, "", nil
}
