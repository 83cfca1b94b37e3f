//go:build !demo

package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestDemoAbsentSaysHowToRunIt proves the service binary, built without the
// demo tag, answers `sigwatch demo` with how to get the demo.
func TestDemoAbsentSaysHowToRunIt(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"demo"}, &stdout, &stderr); code != 1 {
		t.Errorf("got exit code %d, want 1", code)
	}
	if !strings.Contains(stderr.String(), "make demo") {
		t.Errorf("got %q, want a pointer to `make demo`", stderr.String())
	}
}

// TestDevAbsentSaysHowToRunIt: the same for `sigwatch dev`, which points
// to `make run`.
func TestDevAbsentSaysHowToRunIt(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"dev"}, &stdout, &stderr); code != 1 {
		t.Errorf("got exit code %d, want 1", code)
	}
	if !strings.Contains(stderr.String(), "make run") {
		t.Errorf("got %q, want a pointer to `make run`", stderr.String())
	}
}
