//go:build !linux

package bench

import "time"

type pgServer struct {
	dsn, version string
}

func startPostgres(string) (*pgServer, string, error) {
	return nil, "the harness starts PostgreSQL only on Linux", nil
}

func (pg *pgServer) cpu() time.Duration { return 0 }
func (pg *pgServer) stop()              {}
