package testenv

import (
	"testing"

	"github.com/sigwatch/sigwatch/internal/servers"
)

// Alertmanager starts a Prometheus Alertmanager as opts says (a short resolve_timeout, say), alone
// and with a receiver that sends nowhere, stopped when the test ends; when the test failed, the
// end of its log is written to the test log first.
func Alertmanager(t testing.TB, opts servers.AlertmanagerOptions) *servers.Alertmanager {
	t.Helper()
	a, err := servers.StartAlertmanager(t.TempDir(), opts)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	stopWhenDone(t, "alertmanager", a.LogPath(), a.Kill)
	return a
}
