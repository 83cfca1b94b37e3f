package shard_test

import (
	"context"
	"strings"
	"testing"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// TestCheckRedisVersion: a Redis older than 6.2 is refused in one line
// that names the version found, where, and the one needed; 6.2 and newer
// pass.
func TestCheckRedisVersion(t *testing.T) {
	for _, v := range []string{"6.2.0", "6.2.14", "7.0.15", "7.4.1", "8.0.0"} {
		if err := shard.CheckRedisVersion("h:6379", v); err != nil {
			t.Errorf("Redis %s refused: %v", v, err)
		}
	}
	for _, v := range []string{"6.0.16", "5.0.7", "4.0.9"} {
		err := shard.CheckRedisVersion("h:6379", v)
		if err == nil {
			t.Errorf("Redis %s passed; sigwatch needs 6.2", v)
			continue
		}
		msg := err.Error()
		if want := "redis " + v + " at h:6379: sigwatch needs 6.2 or newer"; !strings.HasPrefix(msg, want) || strings.Contains(msg, "\n") {
			t.Errorf("Redis %s: %q, want one line starting %q", v, msg, want)
		}
	}
	if err := shard.CheckRedisVersion("h:6379", ""); err == nil || !strings.Contains(err.Error(), "6.2 or newer") {
		t.Errorf("no version: %v, want a refusal naming 6.2", err)
	}
	if got := shard.InfoField("# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:0\r\n", "redis_version"); got != "7.0.15" {
		t.Errorf("infoField = %q, want 7.0.15", got)
	}
}

// TestCheckVersionOnRealRedis: the Redis the tests run passes, asked
// through the store's own connection.
func TestCheckVersionOnRealRedis(t *testing.T) {
	s := testenv.New(t, testenv.Options{}).Store(t, "sw")
	if err := s.CheckVersion(context.Background()); err != nil {
		t.Fatal(err)
	}
}
